//! The fleet: each worker's row (what it can run, when it started, when it last
//! reported), and what a waiting attempt waits for when no live worker can run its
//! next step ([`leasehold_engine::route`]).

use leasehold_engine::route::{self, Route};
use leasehold_engine::{AttemptRecord, Capabilities, Plan, Timestamp};
use serde::{Deserialize, Serialize};

/// How often a running worker reports itself to the ledger.
pub const REPORT_EVERY_MS: u64 = 10_000;
/// A worker counts as live this long after its last report (three reports missed).
pub const LIVE_FOR_MS: u64 = 3 * REPORT_EVERY_MS;
/// A worker unheard of for this long loses its row (at the next start of any
/// worker).
pub const FORGET_AFTER_MS: u64 = 7 * 24 * 3_600_000;

/// A worker as the ledger last heard of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRow {
    /// Its id (the lease owner it records).
    pub id: String,
    /// What it can run.
    pub capabilities: Capabilities,
    /// When it started (ledger clock).
    pub started_at: Timestamp,
    /// When it last reported (ledger clock).
    pub last_seen_at: Timestamp,
}

impl WorkerRow {
    /// Whether it reported within [`LIVE_FOR_MS`] of `now`.
    pub fn is_live(&self, now: Timestamp) -> bool {
        self.last_seen_at.plus_ms(LIVE_FOR_MS) >= now
    }
}

/// What `record` waits for when it is QUEUED and no worker of `fleet` live at `now`
/// can run its next step: "a worker that can run acme-crm:v1", "a worker that may
/// reach http://crm:80 with http:v1", "a worker that takes queue billing". `None`
/// when it is not waiting, or some live worker can run it.
pub fn waits_for(record: &AttemptRecord, plan: &Plan, fleet: &[WorkerRow], now: Timestamp) -> Option<String> {
    if record.attempt.status != leasehold_engine::AttemptStatus::Queued {
        return None;
    }
    let next = leasehold_engine::transition::next_step(record)?;
    let code = &record.receipt(next)?.step_code;
    let live: Vec<&Capabilities> = fleet
        .iter()
        .filter(|w| w.is_live(now))
        .map(|w| &w.capabilities)
        .collect();
    route::waits_for(&Route::of_step(plan, code), &live)
}

/// The canonical JSON of a worker's capabilities, as its row stores them.
pub(crate) fn capabilities_json(capabilities: &Capabilities) -> String {
    leasehold_engine::canonical::canonical_json(&serde_json::json!(capabilities))
}

/// A worker's capabilities from its row's JSON.
pub(crate) fn parse_capabilities(json: &str) -> Result<Capabilities, super::LedgerError> {
    serde_json::from_str(json)
        .map_err(|e| super::LedgerError::Integrity(format!("worker row: column capabilities_json: {e}")))
}
