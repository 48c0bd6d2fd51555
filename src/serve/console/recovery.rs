//! `/recovery`: bulk recovery, for operators. A form selects attempts (the FAILED
//! ones to retry, by plan, error text and end time; the open ones to abort, by plan
//! and enqueue time); `/recovery/confirm` counts them with a dry run and asks;
//! only the confirmation's POST to `/recovery/act` acts, through the same calls as
//! `POST /api/v1/attempts:retry` and `:abort`. Every step needs the operator role.

use super::{dl, esc, html, q, PageError, PageResult};
use crate::ledger::bulk::{BulkFilter, BulkOutcome, BULK_LIMIT_DEFAULT};
use crate::serve::api::{bulk_filter, bulk_limit_problem, do_bulk, given, Bulk};
use crate::serve::auth::Principal;
use crate::serve::problem::Problem;
use crate::serve::App;
use crate::tokens::Role;
use axum::extract::{Form, Query, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use std::collections::HashMap;
use std::fmt::Write;

type Fields = HashMap<String, String>;

/// What each bulk action is called on the pages.
struct Words {
    op: &'static str,
    verb: &'static str,
    selects: &'static str,
    since: &'static str,
}

fn words(bulk: Bulk) -> Words {
    match bulk {
        Bulk::Retry => Words {
            op: "retry",
            verb: "Retry",
            selects: "failed attempts (each its plan's latest)",
            since: "Ended since",
        },
        Bulk::Abort => Words {
            op: "abort",
            verb: "Abort",
            selects: "open attempts (QUEUED or RUNNING)",
            since: "Enqueued since",
        },
    }
}

/// The action and filter a form or query names; each bad value is a 400 naming
/// its field.
async fn filter_of(app: &App, fields: &Fields) -> Result<(Bulk, BulkFilter), Problem> {
    let text = |k: &str| fields.get(k).map(String::as_str);
    let bulk = match text("op") {
        Some("retry") => Bulk::Retry,
        Some("abort") => Bulk::Abort,
        _ => return Err(Problem::bad_input("op: must be retry or abort")),
    };
    let reason = given(text("reason"));
    if bulk == Bulk::Abort && reason.is_some() {
        return Err(Problem::bad_input("reason: an abort selects by plan and since only"));
    }
    let limit = match given(text("limit")) {
        Some(t) => Some(t.parse::<i64>().map_err(|_| bulk_limit_problem())?),
        None => None,
    };
    let filter = bulk_filter(app, text("plan"), reason, text("since"), limit).await?;
    Ok((bulk, filter))
}

/// The filter as the query of a link or the hidden fields of a form: the plan by
/// its id, `since` as RFC 3339.
fn filter_fields(bulk: Bulk, filter: &BulkFilter) -> Vec<(&'static str, String)> {
    let mut out = vec![("op", words(bulk).op.to_owned())];
    if let Some(plan) = &filter.plan {
        out.push(("plan", plan.as_str().to_owned()));
    }
    if let Some(reason) = &filter.reason {
        out.push(("reason", reason.clone()));
    }
    if let Some(since) = filter.since {
        out.push(("since", since.to_rfc3339()));
    }
    out.push(("limit", filter.limit.to_string()));
    out
}

fn query_of(fields: &[(&str, String)]) -> String {
    fields
        .iter()
        .map(|(k, v)| format!("{k}={}", q(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// One form's text input, holding what the caller typed when this form was theirs.
fn input(label: &str, name: &str, typed: &Fields, mine: bool, hint: &str) -> String {
    let value = if mine {
        typed.get(name).map_or("", String::as_str)
    } else {
        ""
    };
    format!(
        "<label>{label} <input name=\"{name}\" value=\"{}\" placeholder=\"{}\" autocomplete=\"off\"></label>\n",
        esc(value),
        esc(hint)
    )
}

/// The two forms, each holding what was typed into it, and an error, if any.
fn forms(typed: &Fields, error: Option<&str>) -> String {
    let mut out = String::from(
        "<h1>Recovery</h1>\n<p>Act on many attempts at once. Each form first counts what it selects and asks; \
         nothing changes until you confirm. Give at least one filter.</p>\n",
    );
    if let Some(e) = error {
        let _ = writeln!(out, "<p class=\"error\" role=\"alert\">{}</p>", esc(e));
    }
    for bulk in [Bulk::Retry, Bulk::Abort] {
        let w = words(bulk);
        let mine = typed.get("op").map(String::as_str) == Some(w.op);
        let _ = write!(
            out,
            "<section aria-labelledby=\"bulk-{op}\"><h2 id=\"bulk-{op}\">{verb} {selects}</h2>\n\
             <form method=\"get\" action=\"/recovery/confirm\" class=\"recovery\" id=\"{op}-form\">\n\
             <input type=\"hidden\" name=\"op\" value=\"{op}\">\n<fieldset><legend>Select</legend>\n",
            op = w.op,
            verb = w.verb,
            selects = w.selects
        );
        out.push_str(&input("Plan", "plan", typed, mine, "id or name"));
        if bulk == Bulk::Retry {
            out.push_str(&input("Error contains", "reason", typed, mine, "exhausted"));
        }
        out.push_str(&input(w.since, "since", typed, mine, "2026-01-31T00:00:00Z"));
        out.push_str(&input("At most", "limit", typed, mine, &BULK_LIMIT_DEFAULT.to_string()));
        let _ = write!(
            out,
            "</fieldset>\n<button type=\"submit\">Count and confirm…</button>\n</form></section>\n"
        );
    }
    out
}

/// The forms again with `problem` said, at its status (a 400, 404 or 409), or the
/// error page for anything else.
fn refused(who: &Principal, typed: &Fields, problem: Problem) -> PageResult {
    if matches!(problem.status, 400 | 404 | 409) {
        let body = forms(typed, Some(&problem.detail));
        return Ok((problem.status_code(), html("Recovery", who, &body)).into_response());
    }
    Err(PageError::from(problem))
}

/// `GET /recovery`: the forms.
pub(super) async fn page(State(app): State<App>, headers: HeaderMap, Query(typed): Query<Fields>) -> PageResult {
    let who = app.require(&headers, Role::Operator).await?;
    Ok(html("Recovery", &who, &forms(&typed, None)))
}

/// The filter, in words.
fn filter_facts(bulk: Bulk, filter: &BulkFilter) -> String {
    let any = || "any".to_owned();
    let mut facts = vec![(
        "Plan",
        filter
            .plan
            .as_ref()
            .map_or_else(any, |p| format!("<a href=\"/plans/{0}\"><code>{0}</code></a>", esc(p))),
    )];
    if bulk == Bulk::Retry {
        facts.push((
            "Error contains",
            filter
                .reason
                .as_ref()
                .map_or_else(any, |r| format!("<code>{}</code>", esc(r))),
        ));
    }
    facts.push((words(bulk).since, super::time(filter.since)));
    facts.push(("At most", filter.limit.to_string()));
    dl(&facts)
}

/// `GET /recovery/confirm`: counts what the filter selects (a dry run) and asks.
pub(super) async fn confirm(State(app): State<App>, headers: HeaderMap, Query(typed): Query<Fields>) -> PageResult {
    let who = app.require(&headers, Role::Operator).await?;
    let (bulk, filter) = match filter_of(&app, &typed).await {
        Ok(selected) => selected,
        Err(p) => return refused(&who, &typed, p),
    };
    let counted = match do_bulk(&app, &who, bulk, &filter, true).await {
        Ok(counted) => counted,
        Err(p) => return refused(&who, &typed, p),
    };
    let (w, fields) = (words(bulk), filter_fields(bulk, &filter));
    let mut body = format!(
        "<h1>Confirm: {} {} {}</h1>\n{}",
        w.op,
        counted.count,
        w.selects,
        filter_facts(bulk, &filter)
    );
    let change = format!("<a href=\"/recovery?{}\">Change the filter</a>", esc(query_of(&fields)));
    if counted.count == 0 {
        let _ = write!(
            body,
            "<p class=\"empty\" id=\"bulk-count\">Nothing matches: there is nothing to {}.</p>\n<p>{change}</p>",
            w.op
        );
        return Ok(html("Confirm recovery", &who, &body));
    }
    let _ = writeln!(
        body,
        "<p id=\"bulk-count\">The filter selects <strong>{}</strong> {} now.{}</p>",
        counted.count,
        w.selects,
        if counted.more {
            " More match than that: this run acts on the newest; run again for the rest."
        } else {
            ""
        }
    );
    body.push_str("<form method=\"post\" action=\"/recovery/act\" class=\"confirm\">\n");
    for (k, v) in &fields {
        let _ = writeln!(body, "<input type=\"hidden\" name=\"{k}\" value=\"{}\">", esc(v));
    }
    let _ = write!(
        body,
        "<button type=\"submit\" class=\"{op}\" autofocus>Yes, {op} {n} attempts</button> {change}\n</form>",
        op = w.op,
        n = counted.count
    );
    Ok(html("Confirm recovery", &who, &body))
}

/// What a bulk action did, as a page.
fn outcome_body(bulk: Bulk, filter: &BulkFilter, outcome: &BulkOutcome) -> String {
    let w = words(bulk);
    let done = match bulk {
        Bulk::Retry => "Retry enqueued",
        Bulk::Abort => "Aborted",
    };
    let mut body = format!(
        "<h1>{done}: {} attempts</h1>\n<p class=\"notice\" role=\"status\" id=\"bulk-done\">{done} for {} {}.</p>\n{}",
        outcome.count,
        outcome.count,
        w.selects,
        filter_facts(bulk, filter)
    );
    if !outcome.attempts.is_empty() {
        let label = match bulk {
            Bulk::Retry => "The new retry attempts",
            Bulk::Abort => "The aborted attempts",
        };
        let _ = write!(body, "<h2>{label}</h2>\n<ul class=\"bulk-attempts\">");
        for id in &outcome.attempts {
            let _ = write!(body, "<li><a href=\"/attempts/{0}\"><code>{0}</code></a></li>", esc(id));
        }
        body.push_str("</ul>\n");
    }
    if !outcome.refused.is_empty() {
        body.push_str("<h2>Refused (nothing was written for these)</h2>\n<ul class=\"bulk-refused\">");
        for (id, why) in &outcome.refused {
            let _ = write!(
                body,
                "<li><a href=\"/attempts/{0}\"><code>{0}</code></a>: {1}</li>",
                esc(id),
                esc(why)
            );
        }
        body.push_str("</ul>\n");
    }
    if outcome.more {
        let _ = writeln!(
            body,
            "<p>More attempts matched than the limit: <a href=\"/recovery/confirm?{}\">count and confirm the rest</a>.</p>",
            esc(query_of(&filter_fields(bulk, filter)))
        );
    }
    body.push_str("<p><a href=\"/recovery\">Back to recovery</a> · <a href=\"/attempts\">Attempts</a></p>");
    body
}

/// `POST /recovery/act`: acts on what the confirmed filter selects now.
pub(super) async fn act(State(app): State<App>, headers: HeaderMap, Form(typed): Form<Fields>) -> PageResult {
    let who = app.require(&headers, Role::Operator).await?;
    let (bulk, filter) = match filter_of(&app, &typed).await {
        Ok(selected) => selected,
        Err(p) => return refused(&who, &typed, p),
    };
    match do_bulk(&app, &who, bulk, &filter, false).await {
        Ok(outcome) => Ok(html("Recovery done", &who, &outcome_body(bulk, &filter, &outcome))),
        Err(p) => refused(&who, &typed, p),
    }
}
