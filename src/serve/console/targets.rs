//! `/targets`: every target with limits ([`crate::ledger::limits`]) — its limits,
//! the leases on it now, and its circuit breaker's state, failures and end of
//! cool-down.

use super::{esc, html, human, table, time, viewer, PageResult};
use crate::ledger::limits::TargetRow;
use crate::serve::App;
use axum::extract::State;
use axum::http::HeaderMap;
use leasehold_engine::limits::BreakerState;
use leasehold_engine::Timestamp;

/// The page: one row per limited target, or a note that none has limits.
pub(super) async fn page(State(app): State<App>, headers: HeaderMap) -> PageResult {
    let who = viewer(&app, &headers).await?;
    let (targets, now) = app.backend().limits().await?;
    let body = if targets.is_empty() {
        "<h1>Targets</h1>\n<p class=\"empty\">No target has limits: set some with <code>leasehold limits set</code>.</p>"
            .to_owned()
    } else {
        let rows: Vec<String> = targets.iter().map(|t| row(t, now)).collect();
        format!(
            "<h1>Targets</h1>\n<p class=\"sub\">Limits apply to leases that enter a target after they are set; \
             a target without limits admits everything.</p>\n{}",
            table(
                "Targets with limits, by target",
                &[
                    "Target",
                    "Max in flight",
                    "In flight now",
                    "Rate",
                    "Breaker",
                    "Failures",
                    "Open until"
                ],
                &rows
            )
        )
    };
    Ok(html("Targets", &who, &body))
}

/// A breaker's state badge: text first (never colour alone), a distinct mark per state.
fn breaker_badge(state: BreakerState) -> String {
    let (class, mark) = match state {
        BreakerState::Closed => ("succeeded", "✓"),
        BreakerState::Open => ("failed", "✗"),
        BreakerState::HalfOpen => ("queued", "◐"),
    };
    format!(
        "<span class=\"badge {class}\"><span aria-hidden=\"true\">{mark}</span> {}</span>",
        state.as_str()
    )
}

/// One target's row.
fn row(t: &TargetRow, now: Timestamp) -> String {
    let dash = || "—".to_owned();
    let rate = t
        .limit
        .rate
        .map_or_else(dash, |r| format!("{} ({} in window)", esc(r), t.recent));
    let (breaker, failures) = match t.limit.breaker {
        Some(b) => (
            format!(
                "{} <span class=\"sub\">after {} failures, {} cool-down</span>",
                breaker_badge(t.breaker_state),
                b.failures,
                human(b.cooldown_ms)
            ),
            format!("{} of {}", t.failures, b.failures),
        ),
        None => ("none".to_owned(), dash()),
    };
    let open_until = match t.open_until {
        Some(until) if until > now => format!("{} (in {})", time(Some(until)), human(until.millis_since(now))),
        other => time(other),
    };
    format!(
        "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{rate}</td><td>{breaker}</td><td>{failures}</td><td>{open_until}</td></tr>",
        esc(&t.limit.target),
        t.limit.max_in_flight.map_or_else(dash, |n| n.to_string()),
        t.in_flight,
    )
}
