//! The JSON API under `/api/v1`. Every route checks its role on the server; every
//! error is `application/problem+json` ([`Problem`]). Bodies are the CLI's `--json`
//! shapes: plans and attempt records as `leasehold plan show --json` and
//! `leasehold status --json` print them, comparison and gate reports as
//! [`crate::report`] renders them.
//!
//! | route | role |
//! | --- | --- |
//! | `GET /api/v1/plans`, `GET /api/v1/plans/{plan}` | viewer |
//! | `POST /api/v1/plans` | admin |
//! | `POST /api/v1/plans/{plan}/attempts` | operator |
//! | `GET /api/v1/plans/{plan}/attempt-comparison`, `GET /api/v1/plans/{plan}/release-gate` | viewer |
//! | `GET /api/v1/attempts`, `GET /api/v1/attempts/{id}`, `GET /api/v1/counts` | viewer |
//! | `POST /api/v1/attempts/{id}/reconcile`, `…/abort`, `…/retry`, `…/compensate` | operator |
//! | `POST /api/v1/attempts:retry`, `POST /api/v1/attempts:abort` (bulk, with a filter) | operator |
//! | `GET /api/v1/workers`, `GET /api/v1/limits` | viewer |
//! | `PUT /api/v1/limits/{target}`, `DELETE /api/v1/limits/{target}` | operator |
//! | `GET /api/v1/tokens`, `POST /api/v1/tokens`, `POST /api/v1/tokens/{name}/revoke` | admin |
//! | `GET /metrics` | viewer |
//! | `GET /api/v1/healthz`, `GET /api/v1/readyz`, `GET /api/v1/openapi.json` | none |

use super::auth::Principal;
use super::backend::waits_for;
use super::problem::Problem;
use super::when::{parse_duration_ms, parse_rfc3339};
use super::App;
use crate::ledger::bulk::{BulkFilter, BulkOutcome, BULK_LIMIT_DEFAULT, BULK_LIMIT_MAX};
use crate::ledger::listing::{AttemptCursor, AttemptQuery, DamagedRow, PlanRow, PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX};
use crate::ledger::{EnqueueRequest, LedgerError};
use crate::report;
use crate::tokens::Role;
use crate::trace;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use leasehold_engine::evidence::{compare, latest_successful_pair};
use leasehold_engine::gate::gate;
use leasehold_engine::limits::{Breaker, Rate, TargetLimit};
use leasehold_engine::transition::{check_enqueue_key, follow_up_of, ReconcileOutcome, Start};
use leasehold_engine::{Action, AttemptId, AttemptRecord, AttemptStatus, Plan, PlanId, PlanSpec, TraceContext};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

type ApiResult = Result<Response, Problem>;

fn ok(value: Value) -> ApiResult {
    Ok(Json(value).into_response())
}

fn created(value: Value) -> ApiResult {
    Ok((StatusCode::CREATED, Json(value)).into_response())
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<Value, Problem> {
    serde_json::to_value(value).map_err(|e| LedgerError::Internal(format!("cannot render JSON: {e}")).into())
}

/// Parses a JSON request body; an empty body is `{}`.
fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Result<T, Problem> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| Problem::bad_input(format!("request body: {e}")))
}

/// Logs an operator action.
fn audit(who: &Principal, action: &str, target: &str, outcome: &str) {
    tracing::info!(event = "operator_action", token = %who.name, role = %who.role, action, target = %crate::text::clean(target), outcome, "operator action");
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "leasehold",
        description = "The leasehold outbox: plans, attempts, reconcile, comparison and release gate. \
                       Authenticate with `Authorization: Bearer <token>` (see `leasehold token add`). \
                       A change authenticated by the console's session cookie instead must send \
                       `Content-Type: application/json` (else 415)."
    ),
    modifiers(&BearerAuth),
    components(schemas(Problem, EnqueueBody, AbortBody, BulkRetryBody, BulkAbortBody, BulkCount, BulkOutcomeBody, LimitBody, TokenBody, DamagedRow, AttemptPageBody, NotReady))
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "token",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The API's routes, with their OpenAPI description.
pub fn routes() -> OpenApiRouter<App> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(list_plans, register_plan))
        .routes(routes!(get_plan))
        .routes(routes!(enqueue))
        .routes(routes!(attempt_comparison))
        .routes(routes!(release_gate))
        .routes(routes!(list_attempts))
        .routes(routes!(get_attempt))
        .routes(routes!(reconcile))
        .routes(routes!(abort))
        .routes(routes!(retry))
        .routes(routes!(compensate))
        .routes(routes!(bulk_retry))
        .routes(routes!(bulk_abort))
        .routes(routes!(counts))
        .routes(routes!(workers))
        .routes(routes!(list_limits))
        .routes(routes!(set_limit, clear_limit))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(openapi_json))
        .routes(routes!(list_tokens, add_token))
        .routes(routes!(revoke_token))
        .route_layer(axum::middleware::from_fn(super::auth::json_only_for_sessions))
}

/// The OpenAPI document, generated from the handlers' annotations.
pub fn openapi() -> utoipa::openapi::OpenApi {
    routes().split_for_parts().1
}

/// Every plan, oldest first; or, with `limit`, one page of plans, newest first.
#[utoipa::path(get, path = "/api/v1/plans", tag = "plans", security(("token" = [])),
    params(("limit" = Option<u32>, Query, description = "1 to 200: answer that many plans, newest first, instead of every plan oldest first"),
        ("before" = Option<String>, Query, description = "With `limit`: the plans registered before this plan id (the last id of the previous page)")),
    responses((status = 200, description = "Every plan, oldest first (as `leasehold plan list --json`); with `limit`, a page, newest first. \
            A plan whose stored row does not parse is `{\"damaged\": DamagedRow}` in its place (its id if that reads, the reason)", body = Vec<Value>),
        (status = 400, body = Problem, content_type = "application/problem+json"), (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`before` names no plan", body = Problem, content_type = "application/problem+json")))]
async fn list_plans(State(app): State<App>, headers: HeaderMap, Query(q): Query<HashMap<String, String>>) -> ApiResult {
    app.require(&headers, Role::Viewer).await?;
    let limit = page_limit(&q)?;
    let before = q.get("before").filter(|s| !s.is_empty()).map(PlanId::new);
    match (limit, before) {
        (None, None) => ok(plan_rows_json(&app.backend().list_plan_rows().await?)?),
        (None, Some(_)) => Err(Problem::bad_input(format!(
            "before: only pages have one; add limit (1 to {PAGE_LIMIT_MAX})"
        ))),
        (Some(limit), before) => ok(plan_rows_json(
            &app.backend().plan_rows_newest_first(before.as_ref(), limit).await?,
        )?),
    }
}

/// A plans listing as JSON: each plan, or `{"damaged": DamagedRow}` in its place.
fn plan_rows_json(rows: &[PlanRow]) -> Result<Value, Problem> {
    let rows = rows
        .iter()
        .map(|row| match row {
            Ok(plan) => to_json(plan),
            Err(damaged) => Ok(json!({"damaged": to_json(damaged)?})),
        })
        .collect::<Result<Vec<Value>, Problem>>()?;
    Ok(Value::Array(rows))
}

/// Registers a plan (the body is a plan file's content, as JSON).
#[utoipa::path(post, path = "/api/v1/plans", tag = "plans", security(("token" = [])),
    request_body(content = Value, description = "A plan: name, recovery, volatile_fields, steps"),
    responses((status = 201, description = "The registered plan (or the READY plan with the same content)", body = Value),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The plan is invalid", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem), (status = 403, body = Problem)))]
async fn register_plan(State(app): State<App>, headers: HeaderMap, bytes: Bytes) -> ApiResult {
    let who = app.require(&headers, Role::Admin).await?;
    let spec: PlanSpec = body(&bytes)?;
    let plan = app.backend().register_plan(spec, &app.known_executors()).await?;
    audit(&who, "register_plan", plan.id.as_str(), "registered");
    created(to_json(&plan)?)
}

/// A plan by id, or by name (the newest READY plan of that name).
#[utoipa::path(get, path = "/api/v1/plans/{plan}", tag = "plans", security(("token" = [])),
    params(("plan" = String, Path, description = "Plan id or name")),
    responses((status = 200, description = "The plan (as `leasehold plan show --json`)", body = Value),
        (status = 404, body = Problem, content_type = "application/problem+json"), (status = 401, body = Problem)))]
async fn get_plan(State(app): State<App>, headers: HeaderMap, Path(plan): Path<String>) -> ApiResult {
    app.require(&headers, Role::Viewer).await?;
    ok(to_json(&app.backend().find_plan(&plan).await?)?)
}

/// The body of `POST /api/v1/plans/{plan}/attempts`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnqueueBody {
    /// `execute` (default), `retry` or `compensate`.
    #[serde(default)]
    pub action: Option<String>,
    /// Claimable from this instant (RFC 3339; one already past means at once). Not
    /// with `in`.
    #[serde(default)]
    pub at: Option<String>,
    /// Claimable this long after the enqueue (`500ms`, `30s`, `10m`, `2h`, `1d`,
    /// or a sum such as `1h30m`). Not with `at`.
    #[serde(default, rename = "in")]
    pub after: Option<String>,
    /// A template's input: an object of the fields its `[input]` declares.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub input: Option<Value>,
    /// A template's order key (1 to 255 characters): attempts with the same key
    /// run one at a time, in enqueue order.
    #[serde(default)]
    pub order_key: Option<String>,
}

/// A text field as given: trimmed, and `None` when empty.
pub(crate) fn given(text: Option<&str>) -> Option<&str> {
    text.map(str::trim).filter(|t| !t.is_empty())
}

/// When an enqueued attempt becomes claimable, from `at` and `in` (at most one).
pub(crate) fn start_of(at: Option<&str>, after: Option<&str>) -> Result<Start, Problem> {
    match (given(at), given(after)) {
        (None, None) => Ok(Start::Now),
        (Some(_), Some(_)) => Err(Problem::bad_input("at and in: give one of them, not both")),
        (Some(at), None) => parse_rfc3339(at)
            .map(Start::At)
            .map_err(|e| Problem::bad_input(format!("at: {e}"))),
        (None, Some(after)) => parse_duration_ms(after)
            .map(Start::After)
            .map_err(|e| Problem::bad_input(format!("in: {e}"))),
    }
}

/// The request's W3C `traceparent`, if it has a valid one. An invalid one is
/// ignored, as the W3C recommendation asks (the attempt starts a trace of its own),
/// and logged.
fn traceparent_of(headers: &HeaderMap) -> Option<TraceContext> {
    let value = headers.get("traceparent")?;
    match value
        .to_str()
        .map_err(|_| "not visible ASCII")
        .and_then(|v| TraceContext::parse(v).map_err(|e| e.reason))
    {
        Ok(trace) => Some(trace),
        Err(reason) => {
            tracing::warn!(
                reason,
                "ignored an invalid traceparent header; the attempt starts a trace of its own"
            );
            None
        }
    }
}

fn parse_action(text: Option<&str>) -> Result<Action, Problem> {
    match text {
        None => Ok(Action::Execute),
        Some(t) => t
            .parse::<Action>()
            .map_err(|e| Problem::bad_input(format!("action: {e}"))),
    }
}

/// Enqueues an attempt of a plan, claimable at once or from `at` or `in`.
#[utoipa::path(post, path = "/api/v1/plans/{plan}/attempts", tag = "attempts", security(("token" = [])),
    params(("plan" = String, Path, description = "Plan id or name")),
    request_body(content = EnqueueBody),
    params(("plan" = String, Path, description = "Plan id or name"),
        ("Idempotency-Key" = Option<String>, Header, description = "An enqueue key (1 to 255 characters): the same key with the same request answers the attempt the first request created"),
        ("traceparent" = Option<String>, Header, description = "The W3C trace context the attempt joins")),
    request_body(content = EnqueueBody),
    responses((status = 201, description = "The new attempt's record (`command.available_at`: when it is claimable), its `attempt_id` and `created: true`", body = Value),
        (status = 200, description = "The attempt an earlier request with this `Idempotency-Key` created (`created: false`, header `Idempotent-Replayed: true`)", body = Value),
        (status = 409, description = "Refused (an attempt is open, the plan is retired, …)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The `Idempotency-Key` was used by another request", body = Problem, content_type = "application/problem+json"),
        (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem)))]
async fn enqueue(State(app): State<App>, headers: HeaderMap, Path(plan): Path<String>, bytes: Bytes) -> ApiResult {
    let who = app.require(&headers, Role::Producer).await?;
    let request: EnqueueBody = body(&bytes)?;
    let action = parse_action(request.action.as_deref())?;
    let start = start_of(request.at.as_deref(), request.after.as_deref())?;
    let key = enqueue_key_of(&headers)?;
    let parent = traceparent_of(&headers);
    let plan = app.backend().find_plan(&plan).await?;
    let sent = trace::wall_now();
    let request = EnqueueRequest::new(action)
        .at(start)
        .traced(parent)
        .keyed(key)
        .with_input(request.input)
        .ordered(request.order_key);
    let enqueued = app.backend().enqueue_with(&plan.id, request).await?;
    let record = &enqueued.record;
    if !enqueued.created {
        audit(
            &who,
            "enqueue",
            record.attempt.id.as_str(),
            "answered for its Idempotency-Key",
        );
        let replayed = [("idempotent-replayed", "true")];
        return Ok((StatusCode::OK, replayed, Json(to_json(&enqueued)?)).into_response());
    }
    trace::report_enqueue(record, parent.as_ref(), sent);
    let outcome = match start {
        Start::Now => action.as_str().to_owned(),
        _ => format!("{action} from {}", record.command.available_at),
    };
    audit(&who, "enqueue", record.attempt.id.as_str(), &outcome);
    created(to_json(&enqueued)?)
}

/// The request's `Idempotency-Key`, if it has one; one that is not an enqueue key
/// (1 to 255 visible characters) is refused, naming the header.
fn enqueue_key_of(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .map_err(|_| Problem::bad_input("Idempotency-Key: not visible ASCII"))?;
    check_enqueue_key("Idempotency-Key", key).map_err(Problem::bad_input)?;
    Ok(Some(key.to_owned()))
}

/// Resolves the attempts a comparison compares: both given, or the latest two
/// successful ones.
pub(crate) async fn comparison_pair(
    app: &App,
    plan: &Plan,
    left: Option<&str>,
    right: Option<&str>,
) -> Result<(AttemptRecord, AttemptRecord), Problem> {
    let (left, right) = match (left.filter(|s| !s.is_empty()), right.filter(|s| !s.is_empty())) {
        (Some(l), Some(r)) => (
            app.backend().attempt(&AttemptId::new(l)).await?,
            app.backend().attempt(&AttemptId::new(r)).await?,
        ),
        (None, None) => {
            let history = app.backend().history(&plan.id).await?;
            let (l, r) = latest_successful_pair(plan, &history).ok_or_else(|| {
                Problem::bad_input(format!(
                    "plan {} has fewer than two successful attempts to compare",
                    plan.id
                ))
            })?;
            (l.clone(), r.clone())
        }
        _ => return Err(Problem::bad_input("left and right: give both, or neither")),
    };
    for record in [&left, &right] {
        if record.attempt.plan_id != plan.id {
            return Err(Problem::bad_input(format!(
                "attempt {} belongs to plan {}, not {}",
                record.attempt.id, record.attempt.plan_id, plan.id
            )));
        }
    }
    Ok((left, right))
}

/// The semantic comparison of two attempts of a plan (default: the latest two
/// successful ones), as `leasehold compare --json`.
#[utoipa::path(get, path = "/api/v1/plans/{plan}/attempt-comparison", tag = "evidence", security(("token" = [])),
    params(("plan" = String, Path, description = "Plan id or name"),
        ("left" = Option<String>, Query, description = "The left (older) attempt id"),
        ("right" = Option<String>, Query, description = "The right (newer) attempt id")),
    responses((status = 200, description = "The comparison report", body = Value),
        (status = 400, body = Problem, content_type = "application/problem+json"), (status = 401, body = Problem), (status = 404, body = Problem)))]
async fn attempt_comparison(
    State(app): State<App>,
    headers: HeaderMap,
    Path(plan): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    app.require(&headers, Role::Viewer).await?;
    let plan = app.backend().find_plan(&plan).await?;
    let (left, right) = comparison_pair(
        &app,
        &plan,
        q.get("left").map(String::as_str),
        q.get("right").map(String::as_str),
    )
    .await?;
    ok(report::comparison_json(&compare(&plan, &left, &right), &plan))
}

/// The release gate of a plan from its durable evidence, as `leasehold gate --json`.
#[utoipa::path(get, path = "/api/v1/plans/{plan}/release-gate", tag = "evidence", security(("token" = [])),
    params(("plan" = String, Path, description = "Plan id or name")),
    responses((status = 200, description = "The gate report (verdict PASS or BLOCK)", body = Value),
        (status = 401, body = Problem, content_type = "application/problem+json"), (status = 404, body = Problem)))]
async fn release_gate(State(app): State<App>, headers: HeaderMap, Path(plan): Path<String>) -> ApiResult {
    app.require(&headers, Role::Viewer).await?;
    let plan = app.backend().find_plan(&plan).await?;
    let history = app.backend().history(&plan.id).await?;
    ok(report::gate_json(&gate(&plan, &history), &plan))
}

/// The `limit` of a listing's query, if given: 1 to [`PAGE_LIMIT_MAX`], else a 400
/// naming it.
fn page_limit(q: &HashMap<String, String>) -> Result<Option<u32>, Problem> {
    q.get("limit")
        .filter(|s| !s.is_empty())
        .map(|limit| {
            limit
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=PAGE_LIMIT_MAX).contains(n))
                .ok_or_else(|| Problem::bad_input(format!("limit: must be a number from 1 to {PAGE_LIMIT_MAX}")))
        })
        .transpose()
}

/// Parses the query of an attempt listing (`state`, `plan`, `limit`, `cursor`);
/// each bad value is a 400 naming its parameter. `plan` is resolved by id or name.
pub(crate) async fn attempt_query(app: &App, q: &HashMap<String, String>) -> Result<AttemptQuery, Problem> {
    let mut query = AttemptQuery::default();
    if let Some(state) = q.get("state").filter(|s| !s.is_empty()) {
        query.status = Some(
            state
                .parse::<AttemptStatus>()
                .map_err(|e| Problem::bad_input(format!("state: {e}")))?,
        );
    }
    if let Some(plan) = q.get("plan").filter(|s| !s.is_empty()) {
        query.plan = Some(app.backend().find_plan(plan).await?.id);
    }
    if let Some(limit) = page_limit(q)? {
        query.limit = limit;
    }
    if let Some(cursor) = q.get("cursor").filter(|s| !s.is_empty()) {
        query.after = Some(AttemptCursor::decode(cursor)?);
    }
    Ok(query)
}

/// Attempts across plans, newest first, a page at a time (keyset pagination).
#[utoipa::path(get, path = "/api/v1/attempts", tag = "attempts", security(("token" = [])),
    params(("state" = Option<String>, Query, description = "QUEUED, RUNNING, SUCCEEDED, FAILED or ABORTED"),
        ("plan" = Option<String>, Query, description = "Plan id or name"),
        ("limit" = Option<u32>, Query, description = "1 to 200 (default 50)"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page")),
    responses((status = 200, description = "`{\"attempts\": [record…], \"damaged\": [DamagedRow…], \"next_cursor\": string|null, \"limit\": n}`: \
            the attempts that read, newest first, and each row whose stored data does not parse (its id if that reads, its \
            position on the page, the reason); the cursor moves past both", body = AttemptPageBody),
        (status = 400, body = Problem, content_type = "application/problem+json"), (status = 401, body = Problem), (status = 404, body = Problem)))]
async fn list_attempts(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    app.require(&headers, Role::Viewer).await?;
    let query = attempt_query(&app, &q).await?;
    let page = app.backend().list_attempts(&query).await?;
    ok(json!({
        "attempts": to_json(&page.records)?,
        "damaged": to_json(&page.damaged)?,
        "next_cursor": page.next.as_ref().map(AttemptCursor::encode),
        "limit": query.clamped_limit(),
    }))
}

/// The body of `GET /api/v1/attempts` (for the OpenAPI document).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct AttemptPageBody {
    /// The attempts that read, newest first (each as `leasehold status --json`).
    pub attempts: Vec<Value>,
    /// The rows whose stored data does not parse, each in its position on the page;
    /// empty on a sound ledger.
    pub damaged: Vec<DamagedRow>,
    /// `cursor` for the next page; null on the last.
    pub next_cursor: Option<String>,
    /// The page size used.
    pub limit: u32,
}

/// An attempt with its command and receipts (never the lease token).
#[utoipa::path(get, path = "/api/v1/attempts/{id}", tag = "attempts", security(("token" = [])),
    params(("id" = String, Path, description = "Attempt id")),
    responses((status = 200, description = "The record (as `leasehold status --json`), with `waits_for` when \
        no live worker can run its next step", body = Value),
        (status = 404, body = Problem, content_type = "application/problem+json"), (status = 401, body = Problem)))]
async fn get_attempt(State(app): State<App>, headers: HeaderMap, Path(id): Path<String>) -> ApiResult {
    app.require(&headers, Role::Viewer).await?;
    let record = app.backend().attempt(&AttemptId::new(id)).await?;
    let mut json = to_json(&record)?;
    if let (Some(why), Some(object)) = (waits_for(app.backend(), &record).await, json.as_object_mut()) {
        object.insert("waits_for".to_owned(), Value::String(why));
    }
    ok(json)
}

/// Reconciles an attempt: requeues it if its lease expired (refused while live).
pub(crate) async fn do_reconcile(
    app: &App,
    who: &Principal,
    id: &str,
) -> Result<(ReconcileOutcome, AttemptRecord), Problem> {
    match app.backend().reconcile(&AttemptId::new(id)).await {
        Ok((outcome, record)) => {
            let name = match outcome {
                ReconcileOutcome::Requeued => "requeued",
                ReconcileOutcome::Unchanged => "unchanged",
            };
            app.metrics().reconciled(name);
            audit(who, "reconcile", id, name);
            Ok((outcome, record))
        }
        Err(e) => {
            if matches!(e, LedgerError::Refused(_)) {
                app.metrics().reconciled("refused");
                audit(who, "reconcile", id, "refused");
            }
            Err(e.into())
        }
    }
}

/// Requeues an attempt whose lease expired; a live lease is refused (409).
#[utoipa::path(post, path = "/api/v1/attempts/{id}/reconcile", tag = "attempts", security(("token" = [])),
    params(("id" = String, Path, description = "Attempt id")),
    responses((status = 200, description = "`{\"outcome\": \"requeued\"|\"unchanged\", \"record\": record}` (as `leasehold reconcile --json`)", body = Value),
        (status = 409, description = "The lease is live", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem)))]
async fn reconcile(State(app): State<App>, headers: HeaderMap, Path(id): Path<String>) -> ApiResult {
    let who = app.require(&headers, Role::Operator).await?;
    let (outcome, record) = do_reconcile(&app, &who, &id).await?;
    ok(json!({
        "outcome": match outcome { ReconcileOutcome::Requeued => "requeued", ReconcileOutcome::Unchanged => "unchanged" },
        "record": to_json(&record)?,
    }))
}

/// The body of `POST /api/v1/attempts/{id}/abort`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AbortBody {
    /// Recorded on the attempt (default "aborted by operator").
    #[serde(default)]
    pub reason: Option<String>,
}

/// The longest abort reason, in characters.
pub const REASON_MAX_CHARS: usize = 500;

/// Aborts an open attempt as `who`.
pub(crate) async fn do_abort(
    app: &App,
    who: &Principal,
    id: &str,
    reason: Option<&str>,
) -> Result<AttemptRecord, Problem> {
    let reason = reason.map(str::trim).filter(|r| !r.is_empty());
    if reason.is_some_and(|r| r.chars().count() > REASON_MAX_CHARS) {
        return Err(Problem::bad_input(format!(
            "reason: longer than {REASON_MAX_CHARS} characters"
        )));
    }
    let reason = reason.map_or_else(|| format!("aborted by operator ({})", who.name), str::to_owned);
    let record = app.backend().abort(&AttemptId::new(id), &reason).await?;
    audit(who, "abort", id, "aborted");
    Ok(record)
}

/// Aborts a QUEUED or RUNNING attempt, fencing its worker.
#[utoipa::path(post, path = "/api/v1/attempts/{id}/abort", tag = "attempts", security(("token" = [])),
    params(("id" = String, Path, description = "Attempt id")),
    request_body(content = AbortBody),
    responses((status = 200, description = "The aborted attempt's record", body = Value),
        (status = 409, description = "The attempt is already finished", body = Problem, content_type = "application/problem+json"),
        (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem)))]
async fn abort(State(app): State<App>, headers: HeaderMap, Path(id): Path<String>, bytes: Bytes) -> ApiResult {
    let who = app.require(&headers, Role::Operator).await?;
    let request: AbortBody = body(&bytes)?;
    ok(to_json(&do_abort(&app, &who, &id, request.reason.as_deref()).await?)?)
}

/// Enqueues a retry (of a FAILED or ABORTED attempt) or a compensation (of a FAILED
/// forward attempt) on the attempt's plan, as `who`.
pub(crate) async fn do_follow_up(
    app: &App,
    who: &Principal,
    id: &str,
    action: Action,
) -> Result<AttemptRecord, Problem> {
    let record = app.backend().attempt(&AttemptId::new(id)).await?;
    let history = app.backend().history(&record.attempt.plan_id).await?;
    follow_up_of(&record, &history, action).map_err(LedgerError::Refused)?;
    let new = app.backend().enqueue(&record.attempt.plan_id, action).await?;
    audit(who, action.as_str(), id, new.attempt.id.as_str());
    Ok(new)
}

/// Retries a FAILED or ABORTED attempt: enqueues a `retry` attempt of its plan.
#[utoipa::path(post, path = "/api/v1/attempts/{id}/retry", tag = "attempts", security(("token" = [])),
    params(("id" = String, Path, description = "Attempt id (the plan's latest, FAILED or ABORTED)")),
    responses((status = 201, description = "The new retry attempt's record", body = Value),
        (status = 409, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem)))]
async fn retry(State(app): State<App>, headers: HeaderMap, Path(id): Path<String>) -> ApiResult {
    let who = app.require(&headers, Role::Operator).await?;
    created(to_json(&do_follow_up(&app, &who, &id, Action::Retry).await?)?)
}

/// Compensates a FAILED forward attempt: enqueues a `compensate` attempt of its plan.
#[utoipa::path(post, path = "/api/v1/attempts/{id}/compensate", tag = "attempts", security(("token" = [])),
    params(("id" = String, Path, description = "Attempt id (the plan's latest forward attempt, FAILED)")),
    responses((status = 201, description = "The new compensation attempt's record", body = Value),
        (status = 409, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem)))]
async fn compensate(State(app): State<App>, headers: HeaderMap, Path(id): Path<String>) -> ApiResult {
    let who = app.require(&headers, Role::Operator).await?;
    created(to_json(&do_follow_up(&app, &who, &id, Action::Compensate).await?)?)
}

/// The body of `POST /api/v1/attempts:retry`: a filter (at least one of `plan`,
/// `reason` and `since`), a bound and whether to only count.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkRetryBody {
    /// Only this plan's attempts: its id, or its name (the newest READY plan of that name).
    #[serde(default)]
    pub plan: Option<String>,
    /// Only attempts whose error contains this text (`exhausted` selects every
    /// exhausted attempt).
    #[serde(default)]
    pub reason: Option<String>,
    /// Only attempts that ended at or after this instant (RFC 3339).
    #[serde(default)]
    pub since: Option<String>,
    /// At most this many attempts, newest first: 1 to 1000 (default 100).
    #[serde(default)]
    pub limit: Option<i64>,
    /// Only count what would be retried; change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// The body of `POST /api/v1/attempts:abort`: a filter (at least one of `plan` and
/// `since`), a bound and whether to only count.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkAbortBody {
    /// Only this plan's attempts: its id, or its name (the newest READY plan of that name).
    #[serde(default)]
    pub plan: Option<String>,
    /// Only attempts enqueued at or after this instant (RFC 3339).
    #[serde(default)]
    pub since: Option<String>,
    /// At most this many attempts, newest first: 1 to 1000 (default 100).
    #[serde(default)]
    pub limit: Option<i64>,
    /// Only count what would be aborted; change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// A bulk action's dry run: how many attempts it would act on now.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct BulkCount {
    /// The attempts selected (at most the limit).
    pub count: u64,
    /// More attempts matched than the limit lets one call act on.
    pub more: bool,
}

/// What a bulk action did (the library's `BulkOutcome`, as JSON).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct BulkOutcomeBody {
    /// The attempts acted on.
    pub count: u64,
    /// Their ids: the new retry attempts, or the aborted ones.
    pub attempts: Vec<String>,
    /// `[attempt id, why]` for each selected attempt the ledger refused (a race
    /// with a worker or another operator; nothing was written for it).
    pub refused: Vec<Vec<String>>,
    /// More attempts matched than the limit let this call act on: call again.
    pub more: bool,
}

/// A bulk recovery action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bulk {
    /// Retry the FAILED attempts (each its plan's latest).
    Retry,
    /// Abort the QUEUED and RUNNING attempts.
    Abort,
}

impl Bulk {
    /// The action's name in the audit log and the console.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Bulk::Retry => "bulk_retry",
            Bulk::Abort => "bulk_abort",
        }
    }
}

/// The 400 of a bad bulk `limit`.
pub(crate) fn bulk_limit_problem() -> Problem {
    Problem::bad_input(format!("limit: must be a number from 1 to {BULK_LIMIT_MAX}"))
}

/// A bulk filter's fields as given (empty texts mean "not given"); each bad value
/// is a 400 naming its field, and `plan` is resolved by id or name.
pub(crate) async fn bulk_filter(
    app: &App,
    plan: Option<&str>,
    reason: Option<&str>,
    since: Option<&str>,
    limit: Option<i64>,
) -> Result<BulkFilter, Problem> {
    let reason = given(reason).map(str::to_owned);
    if reason.as_ref().is_some_and(|r| r.chars().count() > REASON_MAX_CHARS) {
        return Err(Problem::bad_input(format!(
            "reason: longer than {REASON_MAX_CHARS} characters"
        )));
    }
    let since = given(since)
        .map(|s| parse_rfc3339(s).map_err(|e| Problem::bad_input(format!("since: {e}"))))
        .transpose()?;
    let limit = match limit {
        None => BULK_LIMIT_DEFAULT,
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| (1..=BULK_LIMIT_MAX).contains(n))
            .ok_or_else(bulk_limit_problem)?,
    };
    let plan = match given(plan) {
        Some(plan) => Some(app.backend().find_plan(plan).await?.id),
        None => None,
    };
    Ok(BulkFilter {
        plan,
        reason,
        since,
        limit,
    })
}

/// Runs a bulk action (or its dry run) as `who`, and audits it.
pub(crate) async fn do_bulk(
    app: &App,
    who: &Principal,
    bulk: Bulk,
    filter: &BulkFilter,
    dry_run: bool,
) -> Result<BulkOutcome, Problem> {
    let outcome = match bulk {
        Bulk::Retry => app.backend().retry_failed(filter, dry_run).await?,
        Bulk::Abort => app.backend().abort_open(filter, &who.name, dry_run).await?,
    };
    let target = format!(
        "plan={} reason={} since={} limit={}",
        filter.plan.as_ref().map_or("-", PlanId::as_str),
        filter.reason.as_deref().unwrap_or("-"),
        filter.since.map_or_else(|| "-".to_owned(), |t| t.to_rfc3339()),
        filter.limit
    );
    let done = if dry_run {
        format!("dry run: {} selected", outcome.count)
    } else {
        format!("{} done, {} refused", outcome.count, outcome.refused.len())
    };
    audit(who, bulk.as_str(), &target, &done);
    Ok(outcome)
}

/// A bulk answer: [`BulkCount`] for a dry run, else the outcome.
fn bulk_json(outcome: &BulkOutcome, dry_run: bool) -> Result<Value, Problem> {
    if dry_run {
        return to_json(&BulkCount {
            count: outcome.count,
            more: outcome.more,
        });
    }
    to_json(outcome)
}

/// Retries, in bulk, the FAILED attempts a filter selects (each its plan's latest):
/// one `retry` attempt enqueued per plan, newest first, at most `limit`.
#[utoipa::path(post, path = "/api/v1/attempts:retry", tag = "attempts", security(("token" = [])),
    request_body(content = BulkRetryBody),
    responses((status = 200, description = "What was done; a dry run answers `{\"count\", \"more\"}` (BulkCount) instead", body = BulkOutcomeBody),
        (status = 400, description = "No filter (plan, reason or since), or a bad value (named)", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, description = "`plan` names no plan", body = Problem, content_type = "application/problem+json")))]
async fn bulk_retry(State(app): State<App>, headers: HeaderMap, bytes: Bytes) -> ApiResult {
    let who = app.require(&headers, Role::Operator).await?;
    let r: BulkRetryBody = body(&bytes)?;
    let filter = bulk_filter(
        &app,
        r.plan.as_deref(),
        r.reason.as_deref(),
        r.since.as_deref(),
        r.limit,
    )
    .await?;
    let outcome = do_bulk(&app, &who, Bulk::Retry, &filter, r.dry_run).await?;
    ok(bulk_json(&outcome, r.dry_run)?)
}

/// Aborts, in bulk, the QUEUED and RUNNING attempts a filter selects, newest first,
/// at most `limit`, each with the reason `aborted in bulk by {token name}`.
#[utoipa::path(post, path = "/api/v1/attempts:abort", tag = "attempts", security(("token" = [])),
    request_body(content = BulkAbortBody),
    responses((status = 200, description = "What was done; a dry run answers `{\"count\", \"more\"}` (BulkCount) instead", body = BulkOutcomeBody),
        (status = 400, description = "No filter (plan or since), or a bad value (named)", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, description = "`plan` names no plan", body = Problem, content_type = "application/problem+json")))]
async fn bulk_abort(State(app): State<App>, headers: HeaderMap, bytes: Bytes) -> ApiResult {
    let who = app.require(&headers, Role::Operator).await?;
    let r: BulkAbortBody = body(&bytes)?;
    let filter = bulk_filter(&app, r.plan.as_deref(), None, r.since.as_deref(), r.limit).await?;
    let outcome = do_bulk(&app, &who, Bulk::Abort, &filter, r.dry_run).await?;
    ok(bulk_json(&outcome, r.dry_run)?)
}

/// Attempts per status, each count exact below the cap and "at least the cap" above.
#[utoipa::path(get, path = "/api/v1/counts", tag = "attempts", security(("token" = [])),
    responses((status = 200, description = "`{\"cap\": n, \"states\": [{\"status\", \"count\", \"capped\"}]}`", body = Value),
        (status = 401, body = Problem, content_type = "application/problem+json")))]
async fn counts(State(app): State<App>, headers: HeaderMap) -> ApiResult {
    app.require(&headers, Role::Viewer).await?;
    ok(to_json(&app.backend().count_attempts(app.count_cap()).await?)?)
}

/// The fleet: every worker the ledger has heard of, whether it is live, and what it
/// runs.
#[utoipa::path(get, path = "/api/v1/workers", tag = "workers", security(("token" = [])),
    responses((status = 200, description = "`{\"workers\": [{\"id\", \"live\", \"capabilities\", \"started_at\", \"last_seen_at\"}]}`", body = Value),
        (status = 401, body = Problem, content_type = "application/problem+json")))]
async fn workers(State(app): State<App>, headers: HeaderMap) -> ApiResult {
    app.require(&headers, Role::Viewer).await?;
    let (rows, now) = app.backend().workers().await?;
    let workers: Vec<Value> = rows
        .iter()
        .map(|w| {
            let mut v = to_json(w)?;
            v["live"] = Value::Bool(w.is_live(now));
            Ok(v)
        })
        .collect::<Result<_, Problem>>()?;
    ok(json!({ "workers": workers }))
}

/// Every limited target: its limits, its live leases and its breaker, with the
/// ledger's now.
#[utoipa::path(get, path = "/api/v1/limits", tag = "limits", security(("token" = [])),
    responses((status = 200, description = "`{\"limits\": [{\"target\", \"max_in_flight\", \"rate\": {\"count\", \"per_ms\"}, \
        \"breaker\": {\"failures\", \"cooldown_ms\"}, \"in_flight\", \"breaker_state\", \"failures\", \"open_until\", \"recent\"}], \
        \"now\": ms}` (as `leasehold limits list --json`)", body = Value),
        (status = 401, body = Problem, content_type = "application/problem+json")))]
async fn list_limits(State(app): State<App>, headers: HeaderMap) -> ApiResult {
    app.require(&headers, Role::Viewer).await?;
    let (rows, now) = app.backend().limits().await?;
    ok(json!({ "limits": to_json(&rows)?, "now": now }))
}

/// The body of `PUT /api/v1/limits/{target}`: at least one limit. It replaces the
/// target's limits: a limit not given is removed.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitBody {
    /// Most live leases on the target at once (at least 1).
    #[serde(default)]
    pub max_in_flight: Option<i64>,
    /// Most entries onto the target in any window: `N/s`, `N/m` or `N/h`.
    #[serde(default)]
    pub rate: Option<String>,
    /// Consecutive transient failures (give-backs) that open its circuit breaker.
    #[serde(default)]
    pub breaker_failures: Option<i64>,
    /// How long its open breaker refuses entries, in milliseconds (default 30000;
    /// needs `breaker_failures`).
    #[serde(default)]
    pub breaker_cooldown_ms: Option<i64>,
}

/// A breaker's cool-down when only its threshold is given (the API's and the CLI's).
pub const LIMIT_COOLDOWN_DEFAULT_MS: u64 = 30_000;

/// A whole number from 1 to `max`; the error names `field`.
fn limit_count(field: &str, n: i64, max: u64) -> Result<u64, Problem> {
    if n < 1 {
        return Err(Problem::bad_input(format!("{field}: must be at least 1, not {n}")));
    }
    u64::try_from(n)
        .ok()
        .filter(|n| *n <= max)
        .ok_or_else(|| Problem::bad_input(format!("{field}: must be at most {max}, not {n}")))
}

/// Reads a limit body field by field, so that a value of the wrong type is
/// refused naming its field.
fn limit_body(bytes: &Bytes) -> Result<LimitBody, Problem> {
    let fields: serde_json::Map<String, Value> = body(bytes)?;
    let whole = |key: &str| -> Result<Option<i64>, Problem> {
        match fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| Problem::bad_input(format!("{key}: must be a whole number, not {v}"))),
        }
    };
    if let Some(key) = fields.keys().find(|k| {
        !matches!(
            k.as_str(),
            "max_in_flight" | "rate" | "breaker_failures" | "breaker_cooldown_ms"
        )
    }) {
        return Err(Problem::bad_input(format!(
            "request body: unknown field {key:?}: expected max_in_flight, rate, breaker_failures or breaker_cooldown_ms"
        )));
    }
    let rate = match fields.get("rate") {
        None | Some(Value::Null) => None,
        Some(Value::String(r)) => Some(r.clone()),
        Some(v) => {
            return Err(Problem::bad_input(format!(
                "rate: must be text such as \"50/s\", not {v}"
            )))
        }
    };
    Ok(LimitBody {
        max_in_flight: whole("max_in_flight")?,
        rate,
        breaker_failures: whole("breaker_failures")?,
        breaker_cooldown_ms: whole("breaker_cooldown_ms")?,
    })
}

/// The limit of `target` a body asks for; the error names the field.
fn limit_of(target: &str, b: &LimitBody) -> Result<TargetLimit, Problem> {
    use leasehold_engine::limits::{BREAKER_FAILURES_MAX, COOLDOWN_MS_MAX, MAX_IN_FLIGHT_MAX};
    if b.max_in_flight.is_none() && b.rate.is_none() && b.breaker_failures.is_none() && b.breaker_cooldown_ms.is_none()
    {
        return Err(Problem::bad_input(
            "request body: give at least one of max_in_flight, rate, breaker_failures (with breaker_cooldown_ms)",
        ));
    }
    let max_in_flight = b
        .max_in_flight
        .map(|n| limit_count("max_in_flight", n, MAX_IN_FLIGHT_MAX.into()))
        .transpose()?;
    let rate = b
        .rate
        .as_deref()
        .map(|r| Rate::parse(r).map_err(|e| Problem::bad_input(format!("rate: {e}"))))
        .transpose()?;
    let breaker = match (b.breaker_failures, b.breaker_cooldown_ms) {
        (None, None) => None,
        (None, Some(_)) => return Err(Problem::bad_input("breaker_cooldown_ms: needs breaker_failures")),
        (Some(failures), cooldown) => Some(Breaker {
            failures: limit_count("breaker_failures", failures, BREAKER_FAILURES_MAX.into())? as u32,
            cooldown_ms: match cooldown {
                Some(ms) => limit_count("breaker_cooldown_ms", ms, COOLDOWN_MS_MAX)?,
                None => LIMIT_COOLDOWN_DEFAULT_MS,
            },
        }),
    };
    let limit = TargetLimit {
        target: target.to_owned(),
        max_in_flight: max_in_flight.map(|n| n as u32),
        rate,
        breaker,
    };
    limit.validate().map_err(Problem::bad_input)?;
    Ok(limit)
}

/// Sets a target's limits, replacing any it had; an unknown target is created.
#[utoipa::path(put, path = "/api/v1/limits/{target}", tag = "limits", security(("token" = [])),
    params(("target" = String, Path, description = "The target, percent-encoded (`http%3A%2F%2Fcrm.example%3A80`)")),
    request_body(content = LimitBody),
    responses((status = 200, description = "The limits as set: `{\"target\", \"max_in_flight\", \"rate\", \"breaker\"}`", body = Value),
        (status = 400, description = "A bad value; the detail names the field", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem), (status = 403, body = Problem)))]
async fn set_limit(State(app): State<App>, headers: HeaderMap, Path(target): Path<String>, bytes: Bytes) -> ApiResult {
    let who = app.require(&headers, Role::Operator).await?;
    let limit = limit_of(&target, &limit_body(&bytes)?)?;
    app.backend().set_limit(limit.clone()).await?;
    audit(&who, "set_limit", &target, "set");
    ok(to_json(&limit)?)
}

/// Removes a target's limits; `cleared` says whether it had any.
#[utoipa::path(delete, path = "/api/v1/limits/{target}", tag = "limits", security(("token" = [])),
    params(("target" = String, Path, description = "The target, percent-encoded")),
    responses((status = 200, description = "`{\"target\", \"cleared\": bool}`", body = Value),
        (status = 401, body = Problem, content_type = "application/problem+json"), (status = 403, body = Problem)))]
async fn clear_limit(State(app): State<App>, headers: HeaderMap, Path(target): Path<String>) -> ApiResult {
    let who = app.require(&headers, Role::Operator).await?;
    let cleared = app.backend().clear_limit(&target).await?;
    audit(
        &who,
        "clear_limit",
        &target,
        if cleared { "cleared" } else { "had none" },
    );
    ok(json!({ "target": target, "cleared": cleared }))
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/api/v1/healthz", tag = "health",
    responses((status = 200, description = "`{\"status\": \"ok\"}`", body = Value)))]
async fn healthz() -> ApiResult {
    ok(json!({"status": "ok"}))
}

/// Readiness: the ledger answers, its schema is at this binary's version, and every
/// table the server uses exists with the columns it reads.
#[utoipa::path(get, path = "/api/v1/readyz", tag = "health",
    responses((status = 200, description = "`{\"status\": \"ready\"}`", body = Value),
        (status = 503, description = "The ledger does not answer (`code` `unavailable`), or its schema is not ready \
            (`code` `not_ready`; `problems` names each missing table or the version to migrate to)",
            body = NotReady, content_type = "application/problem+json")))]
async fn readyz(State(app): State<App>) -> ApiResult {
    let problems = app.backend().check_ready().await?;
    if problems.is_empty() {
        return ok(json!({"status": "ready"}));
    }
    tracing::warn!(event = "not_ready", problems = %problems.join("; "), "ledger not ready");
    let problem = Problem::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", problems.join("; "));
    let body = NotReady { problem, problems };
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(super::problem::PROBLEM_JSON),
    );
    Ok(response)
}

/// A 503 from `GET /api/v1/readyz` when the ledger's schema is not ready: a problem
/// (`code` `not_ready`) with what is missing, one line each.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct NotReady {
    /// The problem; its `detail` joins `problems`.
    #[serde(flatten)]
    pub problem: Problem,
    /// What is missing, one line each: "table attempt is missing", "schema version 2
    /// is older than this binary's 3: run `leasehold migrate`". Never the database's
    /// name or URL.
    pub problems: Vec<String>,
}

/// This document.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "health",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", body = Value)))]
async fn openapi_json() -> ApiResult {
    ok(to_json(&openapi())?)
}

/// Every API token: name, role, creation and revocation (never a secret or digest).
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tokens", security(("token" = [])),
    responses((status = 200, description = "Every token, oldest first (as `leasehold token list --json`)", body = Vec<Value>),
        (status = 401, body = Problem, content_type = "application/problem+json"), (status = 403, body = Problem)))]
async fn list_tokens(State(app): State<App>, headers: HeaderMap) -> ApiResult {
    app.require(&headers, Role::Admin).await?;
    ok(to_json(&app.backend().list_tokens().await?)?)
}

/// The body of `POST /api/v1/tokens`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    /// A unique name: letters, digits, '.', '_' or '-'.
    pub name: String,
    /// `viewer`, `operator` or `admin`.
    pub role: String,
}

/// Creates a token; the answer holds its secret, the only time it is shown.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tokens", security(("token" = [])),
    request_body(content = TokenBody),
    responses((status = 201, description = "`{\"name\", \"role\", \"token\"}` (as `leasehold token add --json`)", body = Value),
        (status = 400, description = "A bad or taken name, an unknown role", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem), (status = 403, body = Problem)))]
async fn add_token(State(app): State<App>, headers: HeaderMap, bytes: Bytes) -> ApiResult {
    let who = app.require(&headers, Role::Admin).await?;
    let request: TokenBody = body(&bytes)?;
    let role = request.role.parse::<Role>()?;
    let (info, secret) = app.backend().create_token(&request.name, role, app.now()).await?;
    audit(&who, "add_token", &info.name, role.as_str());
    created(json!({"name": info.name, "role": info.role, "token": secret.expose()}))
}

/// Revokes a token: it is refused from the next request on.
#[utoipa::path(post, path = "/api/v1/tokens/{name}/revoke", tag = "tokens", security(("token" = [])),
    params(("name" = String, Path, description = "The token's name")),
    responses((status = 200, description = "The revoked token", body = Value),
        (status = 404, body = Problem, content_type = "application/problem+json"), (status = 401, body = Problem), (status = 403, body = Problem)))]
async fn revoke_token(State(app): State<App>, headers: HeaderMap, Path(name): Path<String>) -> ApiResult {
    let who = app.require(&headers, Role::Admin).await?;
    let info = app.backend().revoke_token(&name, app.now()).await?;
    app.sessions().close_token(&info.name);
    audit(&who, "revoke_token", &info.name, "revoked");
    ok(to_json(&info)?)
}

async fn metrics_text(app: &App) -> ApiResult {
    let counts = app.backend().count_attempts(app.count_cap()).await?;
    app.metrics().set_counts(&counts, app.now());
    let (targets, _) = app.backend().limits().await?;
    app.metrics().set_targets(&targets);
    let (workers, ledger_now) = app.backend().workers().await?;
    app.metrics().set_workers(&workers, ledger_now);
    let mut response = app.metrics().encode().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(super::metrics::CONTENT_TYPE),
    );
    Ok(response)
}

/// `GET /metrics` on the main listener: a viewer token or session.
pub(crate) async fn metrics_authenticated(State(app): State<App>, headers: HeaderMap) -> ApiResult {
    app.require(&headers, Role::Viewer).await?;
    metrics_text(&app).await
}

/// `GET /metrics` on the private scrape listener: no authentication.
pub(crate) async fn metrics_open(State(app): State<App>) -> ApiResult {
    metrics_text(&app).await
}

/// The default page size, for the docs.
pub const DEFAULT_LIMIT: u32 = PAGE_LIMIT_DEFAULT;
