//! The web console: server-rendered HTML pages, one stylesheet and one small script
//! (live polling), all embedded in the binary.
//!
//! Pages: `/attempts` (filters by state and plan, counts per state, newest first, a
//! page at a time), `/attempts/{id}` (outbox row, receipts, the actions that are
//! legal and permitted), `/attempts/{id}/confirm?action=…` (every action asks
//! first), `/plans`, `/plans/{plan}` (release gate checks, then the evidence
//! history, then a comparison form), `/plans/{plan}/compare`, `/plans/{plan}/gate`,
//! `/fleet` (the workers), `/targets` (every target with limits: its leases in
//! flight and its circuit breaker),
//! `/recovery` (operators: retry failed or abort open attempts in bulk, counted by a
//! dry run and confirmed first) and `/login`. The attempt page
//! leads with what the delivery policy did: an exhausted attempt's reason, a queued
//! one's next delivery, deliveries so far (of the plan's maximum) and last error.
//! After an action, the attempt page shows the fixed notice its
//! redirect names (`?done=requeued`, `unchanged`, `aborted`, `retried`,
//! `compensated`); any other value shows nothing. The attempts list and an open attempt's page refresh their live
//! region every 2 s (`?fragment=live` answers just that region); the script pauses
//! on request and stops while the tab is hidden. Everything works without a mouse:
//! plain links, forms and buttons, a skip link, visible focus.

use super::api::{attempt_query, comparison_pair, do_abort, do_follow_up, do_reconcile};
use super::auth::{clear_cookie, cookie, session_cookie, Principal, SESSION_COOKIE};
use super::problem::Problem;
use super::App;
use crate::ledger::listing::{AttemptCursor, DamagedRow};
use crate::text::{clean, short_sha};
use crate::tokens::{token_hash, Role};
use axum::extract::{Form, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use leasehold_engine::evidence::{compare, raw_fingerprint, semantic_fingerprint, Comparison, Difference};
use leasehold_engine::gate::{gate, GateReport, Verdict};
use leasehold_engine::policy::Exhaustion;
use leasehold_engine::transition::ReconcileOutcome;
use leasehold_engine::{
    Action, AttemptId, AttemptRecord, AttemptStatus, CommandStatus, Plan, PlanId, ReceiptStatus, Timestamp,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;
use std::time::Instant;

mod fleet;
mod recovery;
mod targets;

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// How many characters of a differing value the pages show.
const VALUE_CHARS_MAX: usize = 300;

/// The console's routes.
pub fn routes() -> Router<App> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/attempts") }))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/attempts", get(attempts_page))
        .route("/attempts/{id}", get(attempt_page))
        .route("/attempts/{id}/confirm", get(confirm_page))
        .route("/attempts/{id}/action", post(act))
        .route("/recovery", get(recovery::page))
        .route("/recovery/confirm", get(recovery::confirm))
        .route("/recovery/act", post(recovery::act))
        .route("/fleet", get(fleet::page))
        .route("/targets", get(targets::page))
        .route("/plans", get(plans_page))
        .route("/plans/{plan}", get(plan_page))
        .route("/plans/{plan}/compare", get(compare_page))
        .route("/plans/{plan}/gate", get(gate_page))
        .route(
            "/assets/console.css",
            get(|| async { asset(CSS, "text/css; charset=utf-8") }),
        )
        .route(
            "/assets/console.js",
            get(|| async { asset(JS, "text/javascript; charset=utf-8") }),
        )
}

fn asset(body: &'static str, kind: &'static str) -> Response {
    let mut r = body.into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    r
}

/// HTML-escapes a stored text (made terminal-safe first).
fn esc(text: impl std::fmt::Display) -> String {
    let text = text.to_string();
    let text = clean(&text);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a query value.
fn q(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A page error: the status and a message, or a redirect to the login page.
enum PageError {
    Login,
    Problem(Problem),
}

impl From<Problem> for PageError {
    fn from(p: Problem) -> Self {
        if p.status == 401 {
            PageError::Login
        } else {
            PageError::Problem(p)
        }
    }
}

impl From<crate::ledger::LedgerError> for PageError {
    fn from(e: crate::ledger::LedgerError) -> Self {
        Problem::from(e).into()
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        match self {
            PageError::Login => Redirect::to("/login").into_response(),
            PageError::Problem(p) => {
                let body = format!(
                    "<h1>{} {}</h1>\n<p class=\"error\">{}</p>\n<p><a href=\"/attempts\">Back to attempts</a></p>",
                    p.status,
                    esc(&p.title),
                    esc(&p.detail)
                );
                (p.status_code(), Html(layout(&p.title, None, &body))).into_response()
            }
        }
    }
}

type PageResult = Result<Response, PageError>;

/// A console page's caller, who must be logged in.
async fn viewer(app: &App, headers: &HeaderMap) -> Result<Principal, PageError> {
    Ok(app.require(headers, Role::Viewer).await?)
}

/// The page shell: skip link, navigation, who is logged in, the content.
fn layout(title: &str, who: Option<&Principal>, content: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{} · leasehold</title>\n<link rel=\"stylesheet\" href=\"/assets/console.css\">\n\
         <script src=\"/assets/console.js\" defer></script>\n</head>\n<body>\n\
         <a class=\"skip\" href=\"#main\">Skip to content</a>\n<header class=\"top\">\n\
         <a class=\"brand\" href=\"/attempts\">leasehold</a>\n",
        esc(title)
    );
    if let Some(who) = who {
        let _ = write!(
            out,
            "<nav aria-label=\"Main\"><ul><li><a href=\"/attempts\">Attempts</a></li><li><a href=\"/plans\">Plans</a></li><li><a href=\"/fleet\">Fleet</a></li><li><a href=\"/targets\">Targets</a></li>{}</ul></nav>\n\
             <div class=\"who\"><span>{} <span class=\"role\">({})</span></span>\
             <form method=\"post\" action=\"/logout\"><button type=\"submit\" class=\"link\">Log out</button></form></div>\n",
            if who.role.allows(Role::Operator) {
                "<li><a href=\"/recovery\">Recovery</a></li>"
            } else {
                ""
            },
            esc(&who.name),
            who.role
        );
    }
    let _ = write!(
        out,
        "</header>\n<main id=\"main\" tabindex=\"-1\">\n{content}\n</main>\n</body>\n</html>\n"
    );
    out
}

fn html(title: &str, who: &Principal, content: &str) -> Response {
    Html(layout(title, Some(who), content)).into_response()
}

/// A status badge: text first (never colour alone), a distinct mark per state.
fn attempt_badge(status: AttemptStatus) -> String {
    let (class, mark) = match status {
        AttemptStatus::Queued => ("queued", "◷"),
        AttemptStatus::Running => ("running", "▶"),
        AttemptStatus::Succeeded => ("succeeded", "✓"),
        AttemptStatus::Failed => ("failed", "✗"),
        AttemptStatus::Aborted => ("aborted", "■"),
    };
    format!("<span class=\"badge {class}\"><span aria-hidden=\"true\">{mark}</span> {status}</span>")
}

fn command_badge(status: CommandStatus) -> String {
    let class = match status {
        CommandStatus::Pending | CommandStatus::Waiting => "queued",
        CommandStatus::Processing => "running",
        CommandStatus::Delivered => "succeeded",
        CommandStatus::Failed => "failed",
        CommandStatus::Aborted => "aborted",
    };
    format!("<span class=\"badge {class}\">{status}</span>")
}

fn receipt_badge(status: ReceiptStatus) -> String {
    let class = match status {
        ReceiptStatus::Pending => "pending",
        ReceiptStatus::Running => "running",
        ReceiptStatus::Succeeded => "succeeded",
        ReceiptStatus::Failed => "failed",
        ReceiptStatus::Aborted => "aborted",
    };
    format!("<span class=\"badge {class}\">{status}</span>")
}

fn verdict_badge(verdict: &str) -> String {
    let class = match verdict {
        "PASS" | "EQUAL" => "succeeded",
        "BLOCK" | "DRIFT" => "failed",
        _ => "aborted",
    };
    format!("<span class=\"badge {class}\">{}</span>", esc(verdict))
}

fn time(t: Option<Timestamp>) -> String {
    match t {
        Some(t) => format!("<time datetime=\"{0}\">{0}</time>", t.to_rfc3339()),
        None => "—".to_owned(),
    }
}

/// A span of time, roughly: "12 s", "5 min", "3 h".
fn human(ms: u64) -> String {
    let s = ms / 1000;
    if s < 120 {
        format!("{s} s")
    } else if s < 7200 {
        format!("{} min", s / 60)
    } else {
        format!("{} h", s / 3600)
    }
}

/// "live: 12 s left" or "expired 3 s ago".
fn time_left(until: Timestamp, now: Timestamp) -> String {
    if until > now {
        format!("live: {} left", human(until.millis_since(now)))
    } else {
        format!("expired {} ago", human(now.millis_since(until)))
    }
}

/// When a queued command is next delivered: "in 12 s", or "now" once claimable.
fn next_delivery(at: Timestamp, now: Timestamp) -> String {
    if at > now {
        format!("{} (in {})", time(Some(at)), human(at.millis_since(now)))
    } else {
        format!("{} (claimable now: waiting for a worker)", time(Some(at)))
    }
}

fn duration(from: Option<Timestamp>, to: Option<Timestamp>) -> String {
    match (from, to) {
        (Some(a), Some(b)) => format!("{} ms", b.millis_since(a)),
        _ => "—".to_owned(),
    }
}

fn table(caption: &str, head: &[&str], rows: &[String]) -> String {
    let mut out = format!("<div class=\"table-wrap\" tabindex=\"0\" role=\"region\" aria-label=\"{0}\">\n<table>\n<caption>{0}</caption>\n<thead><tr>", esc(caption));
    for h in head {
        let _ = write!(out, "<th scope=\"col\">{h}</th>");
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for r in rows {
        out.push_str(r);
        out.push('\n');
    }
    out.push_str("</tbody>\n</table>\n</div>\n");
    out
}

fn live_controls() -> &'static str {
    "<p class=\"live-controls\"><button type=\"button\" id=\"live-toggle\" aria-pressed=\"false\">Pause live updates</button> \
     <span id=\"live-status\" role=\"status\">Live: refreshing every 2 s</span></p>"
}

fn fragment(q: &HashMap<String, String>) -> bool {
    q.get("fragment").is_some_and(|f| f == "live")
}

/// A live region's answer: the region alone for the script, or the whole page.
fn live_response(
    q: &HashMap<String, String>,
    title: &str,
    who: &Principal,
    before: &str,
    region: &str,
    src: &str,
    live: bool,
) -> Response {
    if fragment(q) {
        return Html(region.to_owned()).into_response();
    }
    let attrs = if live {
        format!(" data-live-src=\"{}\"", esc(src))
    } else {
        String::new()
    };
    let controls = if live { live_controls() } else { "" };
    html(
        title,
        who,
        &format!("{before}\n{controls}\n<div id=\"live\"{attrs}>\n{region}\n</div>"),
    )
}

/// The names of the plans `ids` name, read one plan at a time (a page shows a few
/// dozen attempts; the ledger may hold millions of plans, so never all of them). A
/// plan that cannot be read is left out: its row shows the id.
async fn plan_names<'a>(app: &App, ids: impl Iterator<Item = &'a str>) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for id in ids {
        if names.contains_key(id) {
            continue;
        }
        if let Ok(plan) = app.backend().find_plan(id).await {
            names.insert(id.to_owned(), plan.name);
        }
    }
    names
}

/// One attempt's row of the attempts list.
fn attempt_row(r: &AttemptRecord, names: &BTreeMap<String, String>) -> String {
    let (a, c) = (&r.attempt, &r.command);
    format!(
        "<tr><td><a href=\"/attempts/{id}\">{id}</a></td><td><a href=\"/plans/{pid}\">{pname}</a></td><td>#{n}</td><td>{action}</td>\
         <td>{status}</td><td>{outbox}</td><td>{owner}</td><td>{deliveries}</td><td>{created}</td></tr>",
        id = esc(&a.id),
        pid = esc(&a.plan_id),
        pname = esc(names.get(a.plan_id.as_str()).map_or(a.plan_id.as_str(), String::as_str)),
        n = a.number,
        action = a.action,
        status = attempt_badge(a.status),
        outbox = command_badge(c.status),
        owner = esc(c.lease_owner.as_deref().unwrap_or("—")),
        deliveries = c.delivery_count,
        created = time(Some(a.created_at)),
    )
}

/// A row of the attempts list whose stored data does not parse: its id (when that
/// reads) and why, in its place, marked damaged (in words, not only by colour).
fn damaged_row(d: &DamagedRow) -> String {
    format!(
        "<tr class=\"damaged\"><td><code>{}</code></td><td colspan=\"8\"><span class=\"badge failed\">\
         <span aria-hidden=\"true\">⚠</span> damaged</span> {}</td></tr>",
        esc(d.id.as_deref().unwrap_or("(id unreadable)")),
        esc(&d.reason)
    )
}

async fn attempts_page(
    State(app): State<App>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> PageResult {
    let who = viewer(&app, &headers).await?;
    let query = attempt_query(&app, &params).await?;
    let counts = app.backend().count_attempts(app.count_cap()).await?;
    let page = app.backend().list_attempts(&query).await?;
    let names = plan_names(&app, page.records.iter().map(|r| r.attempt.plan_id.as_str())).await;
    let state = query.status.map(|s| s.as_str().to_owned()).unwrap_or_default();
    let plan = query.plan.as_ref().map(|p| p.as_str().to_owned()).unwrap_or_default();
    let typed = params.get("plan").map_or("", String::as_str);

    let mut before = String::from("<h1>Attempts</h1>\n<form class=\"filters\" method=\"get\" action=\"/attempts\">\n");
    let _ = write!(
        before,
        "<label>State <select name=\"state\"><option value=\"\">any</option>"
    );
    for s in AttemptStatus::ALL {
        let selected = if s.as_str() == state { " selected" } else { "" };
        let _ = write!(before, "<option{selected}>{s}</option>");
    }
    // The plan is typed (id or name, as the API takes it), with the names of the
    // plans on this page offered: a list of every plan would not scale.
    let _ = write!(
        before,
        "</select></label>\n<label>Plan <input name=\"plan\" value=\"{}\" placeholder=\"any (id or name)\" \
         list=\"plan-names\" autocomplete=\"off\"></label>\n<datalist id=\"plan-names\">",
        esc(typed)
    );
    let offered: BTreeSet<&str> = names.values().map(String::as_str).collect();
    for name in offered {
        let _ = write!(before, "<option value=\"{}\"></option>", esc(name));
    }
    before.push_str("</datalist>\n<button type=\"submit\">Filter</button>\n</form>");

    let mut region = String::from("<ul class=\"counts\" aria-label=\"Attempts per state\">\n");
    for c in &counts.states {
        let shown = if c.capped {
            format!("≥ {}", c.count)
        } else {
            c.count.to_string()
        };
        let _ = writeln!(
            region,
            "<li><a href=\"/attempts?state={0}\">{1} <strong>{shown}</strong></a></li>",
            c.status,
            attempt_badge(c.status)
        );
    }
    region.push_str("</ul>\n");
    let rows: Vec<String> = page
        .rows()
        .into_iter()
        .map(|row| match row {
            Ok(record) => attempt_row(record, &names),
            Err(damaged) => damaged_row(damaged),
        })
        .collect();
    if rows.is_empty() {
        region.push_str("<p class=\"empty\">No attempts match.</p>\n");
    } else {
        region.push_str(&table(
            "Attempts, newest first",
            &[
                "Attempt",
                "Plan",
                "#",
                "Action",
                "Status",
                "Outbox",
                "Owner",
                "Deliveries",
                "Created",
            ],
            &rows,
        ));
    }
    let filter = format!("state={}&plan={}", q(&state), q(&plan));
    if let Some(next) = &page.next {
        let _ = writeln!(
            region,
            "<p class=\"pager\"><a href=\"/attempts?{filter}&cursor={}\" rel=\"next\">Older attempts →</a></p>",
            q(&next.encode())
        );
    }
    let cursor = query.after.as_ref().map(AttemptCursor::encode).unwrap_or_default();
    let src = format!("/attempts?{filter}&cursor={}&fragment=live", q(&cursor));
    Ok(live_response(&params, "Attempts", &who, &before, &region, &src, true))
}

/// Which actions are legal on `record` now, for a caller with `role`.
fn actions(record: &AttemptRecord, role: Role, now: Timestamp) -> Vec<(&'static str, &'static str)> {
    if !role.allows(Role::Operator) {
        return Vec::new();
    }
    let (a, c) = (&record.attempt, &record.command);
    let mut out = Vec::new();
    let expired = c.status == CommandStatus::Processing && c.lease_until.is_some_and(|u| u <= now);
    if expired {
        out.push(("reconcile", "Reconcile (requeue the expired lease)"));
    }
    if !a.status.is_terminal() {
        out.push(("abort", "Abort"));
    }
    if matches!(a.status, AttemptStatus::Failed | AttemptStatus::Aborted) {
        out.push(("retry", "Retry"));
    }
    if a.status == AttemptStatus::Failed && a.action.is_forward() {
        out.push(("compensate", "Compensate"));
    }
    out
}

fn receipts_table(record: &AttemptRecord) -> String {
    let lease_open = record.command.status == CommandStatus::Processing;
    let rows: Vec<String> = record
        .receipts
        .iter()
        .map(|rc| {
            let doubt = if rc.status == ReceiptStatus::Running {
                format!(
                    " <span class=\"doubt\" title=\"begun but not completed: the target may or may not have applied it\">in doubt{}</span>",
                    if lease_open { "" } else { " (no live lease)" }
                )
            } else {
                String::new()
            };
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}{doubt}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                rc.ordinal,
                esc(&rc.step_code),
                if rc.target.is_empty() { "—".to_owned() } else { format!("<code>{}</code>", esc(&rc.target)) },
                receipt_badge(rc.status),
                esc(&rc.idempotency_key),
                time(rc.started_at),
                time(rc.finished_at),
                duration(rc.started_at, rc.finished_at),
                rc.evidence_sha256
                    .as_deref()
                    .map_or_else(|| "—".to_owned(), |s| format!("<code title=\"{0}\">{1}</code>", esc(s), esc(short_sha(s)))),
                esc(rc.error.as_deref().unwrap_or("—")),
            )
        })
        .collect();
    table(
        "Receipts, in order",
        &[
            "#",
            "Step",
            "Target",
            "Status",
            "Idempotency key",
            "Started",
            "Finished",
            "Took",
            "Evidence SHA-256",
            "Error",
        ],
        &rows,
    )
}

fn dl(items: &[(&str, String)]) -> String {
    let mut out = String::from("<dl class=\"facts\">\n");
    for (k, v) in items {
        let _ = writeln!(out, "<div><dt>{k}</dt><dd>{v}</dd></div>");
    }
    out.push_str("</dl>\n");
    out
}

async fn attempt_page(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> PageResult {
    let who = viewer(&app, &headers).await?;
    let record = app.backend().attempt(&AttemptId::new(&id)).await?;
    let plan = app.backend().find_plan(record.attempt.plan_id.as_str()).await.ok();
    let now = app.now();
    let (a, c) = (&record.attempt, &record.command);
    let title = format!("Attempt {}", a.id);
    let before = format!(
        "<h1>Attempt <code>{}</code></h1>\n<p class=\"sub\">#{} of plan <a href=\"/plans/{}\">{}</a> · {}</p>{}",
        esc(&a.id),
        a.number,
        esc(&a.plan_id),
        esc(plan.as_ref().map_or(a.plan_id.as_str(), |p| p.name.as_str())),
        a.action,
        params
            .get("done")
            .and_then(|key| done_text(key))
            .map(|text| format!("\n<p class=\"notice\" role=\"status\">{text}</p>"))
            .unwrap_or_default()
    );
    let mut region = format!(
        "<p class=\"state\">{} <span>outbox {}</span></p>\n",
        attempt_badge(a.status),
        command_badge(c.status)
    );
    let legal = actions(&record, who.role, now);
    if !legal.is_empty() {
        region.push_str("<ul class=\"actions\" aria-label=\"Actions\">\n");
        for (action, label) in &legal {
            let _ = writeln!(
                region,
                "<li><a class=\"button {action}\" href=\"/attempts/{}/confirm?action={action}\">{label}</a></li>",
                esc(&a.id)
            );
        }
        region.push_str("</ul>\n");
    }
    let lease = match c.lease_until {
        Some(until) if c.status == CommandStatus::Processing => {
            format!("{} ({})", time(Some(until)), time_left(until, now))
        }
        Some(until) => time(Some(until)),
        None => "—".to_owned(),
    };
    let max = plan.as_ref().map(|p| p.policy_of(&record).max_deliveries);
    let waits = super::backend::waits_for(app.backend(), &record).await;
    region.push_str(&delivery_summary(&record, (max, waits.as_deref()), now));
    region.push_str("<section aria-labelledby=\"outbox\"><h2 id=\"outbox\">Outbox</h2>\n");
    region.push_str(&dl(&[
        ("Status", command_badge(c.status)),
        ("Owner", esc(c.lease_owner.as_deref().unwrap_or("—"))),
        ("Last heartbeat", time(c.last_heartbeat_at)),
        ("Lease deadline", lease),
        ("Deliveries", deliveries(c.delivery_count, max)),
        ("Last error", esc(c.last_error.as_deref().unwrap_or("—"))),
        ("Available at", time(Some(c.available_at))),
    ]));
    region.push_str("</section>\n<section aria-labelledby=\"attempt\"><h2 id=\"attempt\">Attempt</h2>\n");
    region.push_str(&dl(&[
        ("Status", attempt_badge(a.status)),
        ("Created", time(Some(a.created_at))),
        ("Started", time(a.started_at)),
        ("Finished", time(a.finished_at)),
        ("Error", esc(a.error.as_deref().unwrap_or("—"))),
    ]));
    region.push_str("</section>\n<section aria-labelledby=\"receipts\"><h2 id=\"receipts\">Receipts</h2>\n");
    region.push_str(&receipts_table(&record));
    region.push_str("</section>\n");
    let open = !a.status.is_terminal();
    if !open {
        region.push_str("<span data-live-done hidden></span>\n");
    }
    let src = format!("/attempts/{}?fragment=live", q(a.id.as_str()));
    Ok(live_response(&params, &title, &who, &before, &region, &src, open))
}

/// "2 of at most 25" (the plan's policy for the attempt's next step), or the count
/// alone when the plan cannot be read.
fn deliveries(count: u32, max: Option<u32>) -> String {
    match max {
        Some(max) => format!("{count} of at most {max}"),
        None => count.to_string(),
    }
}

/// The reason of an attempt that ended because its delivery policy ran out.
fn exhausted_reason(record: &AttemptRecord) -> Option<&str> {
    Exhaustion::of(&record.attempt)?;
    record.attempt.error.as_deref()
}

/// What the delivery policy did with an attempt, ahead of the details: an
/// exhausted attempt's reason; a queued one's next delivery, deliveries so far, last
/// error, and what it waits for when no live worker can run it.
fn delivery_summary(record: &AttemptRecord, (max, waits): (Option<u32>, Option<&str>), now: Timestamp) -> String {
    let c = &record.command;
    if let Some(reason) = exhausted_reason(record) {
        return format!(
            "<div class=\"exhausted\" role=\"note\" aria-label=\"Exhausted\"><strong>No further delivery:</strong> {}</div>\n",
            esc(reason)
        );
    }
    if record.attempt.status != AttemptStatus::Queued {
        return String::new();
    }
    let mut items = vec![
        ("Next delivery", next_delivery(c.available_at, now)),
        ("Deliveries so far", deliveries(c.delivery_count, max)),
    ];
    if let Some(error) = &c.last_error {
        items.push(("Last error", esc(error)));
    }
    if let Some(why) = waits {
        items.push(("Waits for", esc(why)));
    }
    format!(
        "<section class=\"delivery\" aria-labelledby=\"delivery\"><h2 id=\"delivery\">Delivery</h2>\n{}</section>\n",
        dl(&items)
    )
}

/// The notice an action's redirect names (`?done=KEY`): a fixed text per key, and
/// nothing for any other key, so that a link cannot put its own words on the page.
fn done_text(key: &str) -> Option<&'static str> {
    match key {
        "requeued" => Some("Requeued: the expired lease was cleared; the attempt waits for a worker."),
        "unchanged" => Some("Unchanged: there was no expired lease to clear."),
        "aborted" => Some("Aborted."),
        "retried" => Some("Retry enqueued: this is the new attempt."),
        "compensated" => Some("Compensation enqueued: this is the new attempt."),
        _ => None,
    }
}

fn action_of(name: &str) -> Option<(&'static str, &'static str)> {
    match name {
        "reconcile" => Some(("reconcile", "Requeue this attempt? Its expired lease is cleared and another worker takes the command over; succeeded steps are kept or replayed as the plan's recovery says.")),
        "abort" => Some(("abort", "Abort this attempt? Its worker is fenced off: its next write is refused. This cannot be undone.")),
        "retry" => Some(("retry", "Enqueue a retry of this plan? A new attempt runs every step again.")),
        "compensate" => Some(("compensate", "Enqueue a compensation? A new attempt undoes the succeeded steps, in reverse order.")),
        _ => None,
    }
}

fn confirm_form(id: &str, action: &str, question: &str, error: Option<&str>) -> String {
    let mut out = format!("<h1>Confirm: {action}</h1>\n");
    if let Some(e) = error {
        let _ = writeln!(out, "<p class=\"error\" role=\"alert\">Refused: {}</p>", esc(e));
    }
    let _ = write!(
        out,
        "<p>Attempt <code>{id_e}</code></p>\n<p>{question}</p>\n<form method=\"post\" action=\"/attempts/{id_e}/action\" class=\"confirm\">\n\
         <input type=\"hidden\" name=\"action\" value=\"{action}\">\n",
        id_e = esc(id),
        question = esc(question)
    );
    if action == "abort" {
        out.push_str("<label>Reason (recorded on the attempt) <input type=\"text\" name=\"reason\" maxlength=\"500\" autocomplete=\"off\"></label>\n");
    }
    let _ = write!(
        out,
        "<button type=\"submit\" class=\"{action}\" autofocus>Yes, {action}</button> <a href=\"/attempts/{}\">Cancel</a>\n</form>",
        esc(id)
    );
    out
}

async fn confirm_page(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> PageResult {
    let who = app.require(&headers, Role::Operator).await?;
    let record = app.backend().attempt(&AttemptId::new(&id)).await?;
    let (action, question) = params
        .get("action")
        .and_then(|a| action_of(a))
        .ok_or_else(|| Problem::bad_input("action: must be reconcile, abort, retry or compensate"))?;
    Ok(html(
        &format!("Confirm {action}"),
        &who,
        &confirm_form(record.attempt.id.as_str(), action, question, None),
    ))
}

async fn act(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> PageResult {
    let who = app.require(&headers, Role::Operator).await?;
    let (action, question) = form
        .get("action")
        .and_then(|a| action_of(a))
        .ok_or_else(|| Problem::bad_input("action: must be reconcile, abort, retry or compensate"))?;
    let result: Result<(String, &str), Problem> = match action {
        "reconcile" => do_reconcile(&app, &who, &id).await.map(|(outcome, r)| {
            let done = match outcome {
                ReconcileOutcome::Requeued => "requeued",
                ReconcileOutcome::Unchanged => "unchanged",
            };
            (r.attempt.id.as_str().to_owned(), done)
        }),
        "abort" => do_abort(&app, &who, &id, form.get("reason").map(String::as_str))
            .await
            .map(|r| (r.attempt.id.as_str().to_owned(), "aborted")),
        other => {
            let (a, done) = if other == "retry" {
                (Action::Retry, "retried")
            } else {
                (Action::Compensate, "compensated")
            };
            do_follow_up(&app, &who, &id, a)
                .await
                .map(|r| (r.attempt.id.as_str().to_owned(), done))
        }
    };
    match result {
        Ok((target, done)) => Ok(Redirect::to(&format!("/attempts/{}?done={done}", q(&target))).into_response()),
        Err(p) if p.status == 409 || p.status == 400 => {
            let body = confirm_form(&id, action, question, Some(&p.detail));
            Ok((p.status_code(), html(&format!("Confirm {action}"), &who, &body)).into_response())
        }
        Err(p) => Err(p.into()),
    }
}

/// Plans a page of the plans list shows.
const PLANS_PER_PAGE: u32 = 50;

/// One plan's row of the plans list.
fn plan_row(p: &Plan) -> String {
    format!(
        "<tr><td><a href=\"/plans/{id}\">{name}</a></td><td><code>{id}</code></td><td>{status}</td><td>{recovery}</td><td>{steps}</td><td><code title=\"{fp}\">{short}</code></td><td>{created}</td></tr>",
        id = esc(&p.id),
        name = esc(&p.name),
        status = p.status,
        recovery = p.recovery,
        steps = p.steps.len(),
        fp = esc(&p.fingerprint),
        short = esc(short_sha(&p.fingerprint)),
        created = time(Some(p.created_at)),
    )
}

/// A row of the plans list whose stored data does not parse, marked damaged.
fn damaged_plan_row(d: &DamagedRow) -> String {
    format!(
        "<tr class=\"damaged\"><td><span class=\"badge failed\"><span aria-hidden=\"true\">⚠</span> damaged</span></td>\
         <td><code>{}</code></td><td colspan=\"5\">{}</td></tr>",
        esc(d.id.as_deref().unwrap_or("(id unreadable)")),
        esc(&d.reason)
    )
}

async fn plans_page(
    State(app): State<App>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> PageResult {
    let who = viewer(&app, &headers).await?;
    let before = params.get("before").filter(|s| !s.is_empty()).map(PlanId::new);
    // One more than a page, to know whether there is an older one.
    let mut plans = app
        .backend()
        .plan_rows_newest_first(before.as_ref(), PLANS_PER_PAGE + 1)
        .await?;
    let older = plans.len() > PLANS_PER_PAGE as usize;
    plans.truncate(PLANS_PER_PAGE as usize);
    let rows: Vec<String> = plans
        .iter()
        .map(|row| match row {
            Ok(p) => plan_row(p),
            Err(damaged) => damaged_plan_row(damaged),
        })
        .collect();
    let mut body = if rows.is_empty() && before.is_none() {
        "<h1>Plans</h1>\n<p class=\"empty\">No plans yet: register one with <code>leasehold plan add FILE</code> or <code>POST /api/v1/plans</code>.</p>".to_owned()
    } else if rows.is_empty() {
        "<h1>Plans</h1>\n<p class=\"empty\">No older plans.</p>".to_owned()
    } else {
        format!(
            "<h1>Plans</h1>\n{}",
            table(
                "Plans, newest first",
                &["Name", "Id", "Status", "Recovery", "Steps", "Fingerprint", "Registered"],
                &rows
            )
        )
    };
    // The next page starts before the last plan whose id reads.
    let last = plans.iter().rev().find_map(|row| match row {
        Ok(p) => Some(p.id.as_str()),
        Err(d) => d.id.as_deref(),
    });
    if let (true, Some(last)) = (older, last) {
        let _ = writeln!(
            body,
            "<p class=\"pager\"><a href=\"/plans?before={}\" rel=\"next\">Older plans →</a></p>",
            q(last)
        );
    }
    Ok(html("Plans", &who, &body))
}

fn checks_table(report: &GateReport) -> String {
    let rows: Vec<String> = report
        .checks
        .iter()
        .map(|c| {
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                verdict_badge(c.verdict.as_str()),
                esc(c.name.as_str()),
                esc(&c.reason)
            )
        })
        .collect();
    table("Release gate checks", &["Verdict", "Check", "Reason"], &rows)
}

fn history_table(plan: &Plan, history: &[AttemptRecord]) -> String {
    let rows: Vec<String> = history
        .iter()
        .rev()
        .map(|r| {
            let done = r.receipts.iter().filter(|x| x.status == ReceiptStatus::Succeeded).count();
            format!(
                "<tr><td>#{}</td><td><a href=\"/attempts/{id}\">{id}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}/{}</td><td>{}</td><td><code>{}</code></td><td><code>{}</code></td><td>{}</td></tr>",
                r.attempt.number,
                r.attempt.action,
                attempt_badge(r.attempt.status),
                command_badge(r.command.status),
                done,
                r.receipts.len(),
                r.command.delivery_count,
                esc(short_sha(&raw_fingerprint(&r.receipts))),
                esc(short_sha(&semantic_fingerprint(plan, &r.receipts))),
                time(Some(r.attempt.created_at)),
                id = esc(&r.attempt.id),
            )
        })
        .collect();
    if rows.is_empty() {
        return "<p class=\"empty\">No attempts yet.</p>".to_owned();
    }
    table(
        "Evidence history, newest first",
        &[
            "#",
            "Attempt",
            "Action",
            "Status",
            "Outbox",
            "Steps done",
            "Deliveries",
            "Raw fingerprint",
            "Semantic fingerprint",
            "Created",
        ],
        &rows,
    )
}

fn plan_header(plan: &Plan) -> String {
    let steps: Vec<String> = plan
        .steps
        .iter()
        .map(|s| {
            format!(
                "<li><code>{}</code> <span class=\"muted\">({})</span></li>",
                esc(&s.code),
                esc(&s.executor)
            )
        })
        .collect();
    format!(
        "<h1>Plan {}</h1>\n{}<details><summary>Steps ({})</summary><ol>{}</ol></details>",
        esc(&plan.name),
        dl(&[
            ("Id", format!("<code>{}</code>", esc(&plan.id))),
            ("Status", esc(plan.status)),
            ("Recovery", esc(plan.recovery)),
            (
                "Fingerprint",
                format!(
                    "<code title=\"{0}\">{1}</code>",
                    esc(&plan.fingerprint),
                    esc(short_sha(&plan.fingerprint))
                )
            ),
            ("Registered", time(Some(plan.created_at))),
        ]),
        plan.steps.len(),
        steps.join("")
    )
}

async fn plan_page(State(app): State<App>, headers: HeaderMap, Path(plan): Path<String>) -> PageResult {
    let who = viewer(&app, &headers).await?;
    let plan = app.backend().find_plan(&plan).await?;
    let history = app.backend().history(&plan.id).await?;
    let report = gate(&plan, &history);
    let id = esc(&plan.id);
    let mut body = plan_header(&plan);
    let _ = write!(
        body,
        "\n<section aria-labelledby=\"gate\"><h2 id=\"gate\">Release gate {}</h2>\n{}<p><a href=\"/plans/{id}/gate\">Full gate report</a></p></section>\n",
        verdict_badge(report.verdict.as_str()),
        checks_table(&report)
    );
    let _ = write!(
        body,
        "<section aria-labelledby=\"history\"><h2 id=\"history\">Evidence history</h2>\n{}</section>\n",
        history_table(&plan, &history)
    );
    let succeeded: Vec<&AttemptRecord> = history
        .iter()
        .filter(|r| r.attempt.status == AttemptStatus::Succeeded)
        .collect();
    body.push_str("<section aria-labelledby=\"compare\"><h2 id=\"compare\">Compare attempts</h2>\n");
    if succeeded.len() < 2 {
        body.push_str("<p class=\"empty\">Comparison needs two successful attempts.</p>");
    } else {
        let options = |pick: usize| -> String {
            succeeded
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    format!(
                        "<option value=\"{}\"{}>#{} {}</option>",
                        esc(&r.attempt.id),
                        if i == pick { " selected" } else { "" },
                        r.attempt.number,
                        esc(&r.attempt.id)
                    )
                })
                .collect()
        };
        let _ = write!(
            body,
            "<form method=\"get\" action=\"/plans/{id}/compare\" class=\"filters\">\
             <label>Left (older) <select name=\"left\">{}</select></label>\
             <label>Right (newer) <select name=\"right\">{}</select></label>\
             <button type=\"submit\">Compare</button></form>",
            options(succeeded.len() - 2),
            options(succeeded.len() - 1)
        );
    }
    body.push_str("</section>");
    Ok(html(&format!("Plan {}", plan.name), &who, &body))
}

fn value(v: Option<&Value>) -> String {
    match v {
        None => "<span class=\"muted\">(absent)</span>".to_owned(),
        Some(v) => {
            let text = leasehold_engine::canonical::canonical_json(v);
            let shown: String = text.chars().take(VALUE_CHARS_MAX).collect();
            let cut = if text.chars().count() > VALUE_CHARS_MAX {
                "…"
            } else {
                ""
            };
            format!("<code>{}{cut}</code>", esc(shown))
        }
    }
}

fn differences_table(caption: &str, diffs: &[Difference], left: &str, right: &str) -> String {
    let rows: Vec<String> = diffs
        .iter()
        .map(|d| {
            let receipt = match (d.ordinal, &d.step_code) {
                (Some(o), Some(code)) => format!("{o} ({})", esc(code)),
                _ => "—".to_owned(),
            };
            format!(
                "<tr><td><code>{}</code></td><td>{receipt}</td><td>{}</td><td>{}</td></tr>",
                esc(&d.path),
                value(d.left.as_ref()),
                value(d.right.as_ref())
            )
        })
        .collect();
    table(caption, &["Field", "Receipt", left, right], &rows)
}

fn comparison_body(plan: &Plan, c: &Comparison) -> String {
    let mut body = format!(
        "<h1>Comparison {}</h1>\n<p class=\"sub\">Plan <a href=\"/plans/{}\">{}</a>: attempt #{} against #{}</p>\n",
        verdict_badge(c.verdict.as_str()),
        esc(&plan.id),
        esc(&plan.name),
        c.left.number,
        c.right.number
    );
    let side = |name: &str, s: &leasehold_engine::evidence::AttemptSide| {
        format!(
            "<tr><th scope=\"row\">{name}</th><td><a href=\"/attempts/{id}\">{id}</a> (#{})</td><td>{}</td><td><code title=\"{raw}\">{}</code></td><td><code title=\"{sem}\">{}</code></td></tr>",
            s.number,
            attempt_badge(s.status),
            esc(short_sha(&s.raw_fingerprint)),
            esc(short_sha(&s.semantic_fingerprint)),
            id = esc(&s.attempt_id),
            raw = esc(&s.raw_fingerprint),
            sem = esc(&s.semantic_fingerprint),
        )
    };
    body.push_str(&table(
        "Attempts compared",
        &["Side", "Attempt", "Status", "Raw fingerprint", "Semantic fingerprint"],
        &[side("Left", &c.left), side("Right", &c.right)],
    ));
    let _ = write!(
        body,
        "{}",
        dl(&[
            ("Steps", if c.steps_equal { "equal".into() } else { "differ".into() }),
            (
                "Semantic fingerprints",
                if c.semantic_equal {
                    "equal".into()
                } else {
                    "differ".into()
                }
            ),
        ])
    );
    if !c.problems.is_empty() {
        body.push_str("<h2>Problems</h2><ul>");
        for p in &c.problems {
            let _ = write!(body, "<li>{}</li>", esc(p));
        }
        body.push_str("</ul>");
    }
    body.push_str("<h2>Differences, field by field</h2>\n");
    if c.differences.is_empty() {
        body.push_str("<p class=\"empty\">None: the evidence is semantically equal.</p>");
    } else {
        body.push_str(&differences_table("Differing fields", &c.differences, "Left", "Right"));
    }
    body
}

async fn compare_page(
    State(app): State<App>,
    headers: HeaderMap,
    Path(plan): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> PageResult {
    let who = viewer(&app, &headers).await?;
    let plan = app.backend().find_plan(&plan).await?;
    let (left, right) = comparison_pair(
        &app,
        &plan,
        params.get("left").map(String::as_str),
        params.get("right").map(String::as_str),
    )
    .await?;
    let comparison = compare(&plan, &left, &right);
    Ok(html(
        &format!("Comparison · {}", plan.name),
        &who,
        &comparison_body(&plan, &comparison),
    ))
}

async fn gate_page(State(app): State<App>, headers: HeaderMap, Path(plan): Path<String>) -> PageResult {
    let who = viewer(&app, &headers).await?;
    let plan = app.backend().find_plan(&plan).await?;
    let history = app.backend().history(&plan.id).await?;
    let report = gate(&plan, &history);
    let mut body = format!(
        "<h1>Release gate {}</h1>\n<p class=\"sub\">Plan <a href=\"/plans/{}\">{}</a>: {}</p>\n",
        verdict_badge(report.verdict.as_str()),
        esc(&plan.id),
        esc(&plan.name),
        if report.verdict == Verdict::Pass {
            "the latest attempt may be released"
        } else {
            "may not be released"
        }
    );
    body.push_str("<section aria-labelledby=\"checks\"><h2 id=\"checks\">Checks</h2>\n");
    body.push_str(&checks_table(&report));
    let attempt = |a: &Option<leasehold_engine::gate::AttemptRef>| {
        a.as_ref().map_or_else(
            || "none".to_owned(),
            |a| {
                format!(
                    "<a href=\"/attempts/{0}\">{0}</a> (#{1}, {2})",
                    esc(&a.attempt_id),
                    a.number,
                    esc(a.status)
                )
            },
        )
    };
    let fp = |f: &Option<String>| {
        f.as_deref()
            .map_or_else(|| "—".to_owned(), |f| format!("<code>{}</code>", esc(f)))
    };
    body.push_str(&dl(&[
        ("Latest attempt", attempt(&report.latest)),
        ("Baseline attempt", attempt(&report.baseline)),
        ("Raw fingerprint", fp(&report.raw_fingerprint)),
        ("Semantic fingerprint", fp(&report.semantic_fingerprint)),
        ("Baseline semantic", fp(&report.baseline_semantic_fingerprint)),
    ]));
    body.push_str("</section>\n");
    if !report.tampered.is_empty() {
        body.push_str("<section><h2>Tampered receipts</h2><ul>");
        for t in &report.tampered {
            let _ = write!(body, "<li>{}</li>", esc(t));
        }
        body.push_str("</ul></section>\n");
    }
    if !report.drift.is_empty() {
        body.push_str("<section><h2>Differences from the baseline</h2>\n");
        body.push_str(&differences_table(
            "Differing fields",
            &report.drift,
            "Baseline",
            "Latest",
        ));
        body.push_str("</section>\n");
    }
    let _ = write!(
        body,
        "<section aria-labelledby=\"history\"><h2 id=\"history\">Evidence history</h2>\n{}</section>",
        history_table(&plan, &history)
    );
    Ok(html(&format!("Gate · {}", plan.name), &who, &body))
}

fn login_form(error: Option<&str>) -> String {
    let mut out = String::from("<h1>Log in</h1>\n");
    if let Some(e) = error {
        let _ = writeln!(out, "<p class=\"error\" role=\"alert\">{}</p>", esc(e));
    }
    out.push_str(
        "<form method=\"post\" action=\"/login\" class=\"login\">\n\
         <label>API token <input type=\"password\" name=\"token\" autocomplete=\"off\" required autofocus></label>\n\
         <button type=\"submit\">Log in</button>\n</form>\n\
         <p class=\"muted\">Create a token with <code>leasehold token add NAME --role viewer|operator|admin</code>. \
         The console keeps a session cookie; the token is not stored in the browser.</p>",
    );
    out
}

fn logged_in(token_hash: String, token_name: &str, app: &App) -> PageResult {
    let id = app.sessions().open(token_hash, token_name, Instant::now())?;
    let mut response = Redirect::to("/attempts").into_response();
    response.headers_mut().insert(header::SET_COOKIE, session_cookie(&id));
    Ok(response)
}

async fn login_page(State(app): State<App>, Query(params): Query<HashMap<String, String>>) -> PageResult {
    if let Some(code) = params.get("code") {
        let token = match app.sessions().redeem(code, Instant::now()) {
            Some(hash) => app.backend().token_by_hash(&hash).await?.map(|t| (hash, t)),
            None => None,
        };
        return match token {
            Some((hash, token)) => logged_in(hash, &token.name, &app),
            None => Ok((
                StatusCode::UNAUTHORIZED,
                Html(layout(
                    "Log in",
                    None,
                    &login_form(Some(
                        "This login link was used already or has expired: log in with a token.",
                    )),
                )),
            )
                .into_response()),
        };
    }
    Ok(Html(layout("Log in", None, &login_form(None))).into_response())
}

async fn login(State(app): State<App>, Form(form): Form<HashMap<String, String>>) -> PageResult {
    let token = form.get("token").map(|t| t.trim()).unwrap_or_default();
    let hash = token_hash(token);
    if !token.is_empty() {
        if let Some(found) = app.backend().token_by_hash(&hash).await? {
            tracing::info!(event = "login", "console login");
            return logged_in(hash, &found.name, &app);
        }
    }
    Ok((
        StatusCode::UNAUTHORIZED,
        Html(layout("Log in", None, &login_form(Some("Unknown or revoked token.")))),
    )
        .into_response())
}

async fn logout(State(app): State<App>, headers: HeaderMap) -> Response {
    if let Some(session) = cookie(&headers, SESSION_COOKIE) {
        app.sessions().close(session);
    }
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().insert(header::SET_COOKIE, clear_cookie());
    response
}

/// Unknown paths: problem+json under `/api/`, an HTML page elsewhere.
pub(crate) async fn not_found(uri: axum::http::Uri) -> Response {
    let p = Problem::not_found(format!("no route {}", uri.path()));
    if uri.path().starts_with("/api/") {
        p.into_response()
    } else {
        PageError::Problem(p).into_response()
    }
}
