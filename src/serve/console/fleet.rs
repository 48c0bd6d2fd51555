//! `/fleet`: the workers the ledger has heard of — live or not, what each runs (its
//! executors and the targets they reach) and which queues it takes — from their
//! rows ([`crate::ledger::fleet`]).

use super::{esc, html, table, time, viewer, PageResult};
use crate::ledger::fleet::{WorkerRow, LIVE_FOR_MS};
use crate::serve::App;
use axum::extract::State;
use axum::http::HeaderMap;
use leasehold_engine::{Reach, Timestamp};

pub(super) async fn page(State(app): State<App>, headers: HeaderMap) -> PageResult {
    let who = viewer(&app, &headers).await?;
    let (workers, now) = app.backend().workers().await?;
    let body = if workers.is_empty() {
        "<h1>Fleet</h1>\n<p class=\"empty\">No worker has reported yet: start one with <code>leasehold worker</code>.</p>"
            .to_owned()
    } else {
        let rows: Vec<String> = workers.iter().map(|w| row(w, now)).collect();
        format!(
            "<h1>Fleet</h1>\n<p class=\"sub\">A worker is live while it has reported within the last {} s.</p>\n{}",
            LIVE_FOR_MS / 1_000,
            table(
                "Workers, by id",
                &["Worker", "State", "Runs", "Queues", "Last seen", "Started"],
                &rows
            )
        )
    };
    Ok(html("Fleet", &who, &body))
}

/// One worker's row.
fn row(w: &WorkerRow, now: Timestamp) -> String {
    let state = if w.is_live(now) { "live" } else { "not seen lately" };
    let runs: Vec<String> = w
        .capabilities
        .executors
        .iter()
        .map(|(executor, reach)| match reach {
            Reach::Any => format!("<code>{}</code>", esc(executor)),
            Reach::Only(targets) if targets.is_empty() => format!("<code>{}</code> (no target)", esc(executor)),
            Reach::Only(targets) => {
                let targets: Vec<String> = targets.iter().map(|t| format!("<code>{}</code>", esc(t))).collect();
                format!("<code>{}</code> to {}", esc(executor), targets.join(", "))
            }
        })
        .collect();
    let queues: Vec<String> = w.capabilities.queues.iter().map(esc).collect();
    format!(
        "<tr><td><code>{}</code></td><td>{state}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        esc(&w.id),
        runs.join("<br>"),
        queues.join(", "),
        time(Some(w.last_seen_at)),
        time(Some(w.started_at)),
    )
}
