//! `leasehold target`: a reference idempotent HTTP receiver, for tests and as a
//! template for your own.
//!
//! A worker's `http:v1` step sends the same `Idempotency-Key` on every try, every
//! redelivery and every takeover. A receiver turns that into "exactly once in effect"
//! by keeping, durably and atomically with the effect, what it answered for each key.
//! This module is such a receiver, kept small so that it can be read and copied. The
//! behaviour follows the IETF httpapi Idempotency-Key draft:
//!
//! 1. A request without an `Idempotency-Key` header gets **400**. (The key may be sent
//!    bare or as a quoted structured-header string; 1 to 255 visible ASCII characters.)
//! 2. The body's SHA-256 is the request's fingerprint.
//! 3. The key is claimed in the store ([`KeyStore::begin`]): a new key is inserted as
//!    *processing* under a fresh claim token, guarded by the key's uniqueness, so of
//!    two concurrent first requests exactly one wins.
//! 4. A key already *done* with the same fingerprint is answered with the stored
//!    response and `Idempotent-Replayed: true`; with another fingerprint, **422**.
//! 5. A key still *processing* (another request holds it) gets **409** with
//!    `Retry-After: 1` (or 422 if its fingerprint differs).
//! 6. The holder does the work, then applies the effect and stores the response in
//!    **one transaction** ([`KeyStore::apply`]), guarded by its claim token: a crash
//!    before that commit leaves no effect and a claim that expires after
//!    [`PROCESSING_HOLD`] (plus the configured delay), when a repeat of the same body
//!    may take the key over; a crash after it leaves both the effect and the response.
//!    The work runs in a task of its own, so a client that hangs up (a killed worker)
//!    does not leave the key half-done.
//!
//! The effect here is one row per applied key in an effects table, with no unique
//! constraint: a receiver that applied a key twice would show two rows, so
//! `GET /effects` ([`Effects`]) proves exactly-once instead of assuming it; each row
//! also keeps the request's path, and its id the order of the applications. A real
//! receiver replaces that insert with its own business write (create the order),
//! in the same transaction as the stored response. An effect outside the database (a
//! call to yet another service) cannot share the transaction: pass the key on to it.
//!
//! Fault injection ([`Faults`]) makes it a test fixture: a request may be answered
//! 503 before anything is done, or have its effect applied and its connection closed
//! without a reply (the ambiguous case a sender must retry with the same key).
//!
//! The receiver is served by [`crate::listener`]: header and request timeouts, a
//! connection cap, a `Host` check (an IP address, `localhost` or a configured
//! public origin; anything else is 421, against DNS rebinding) and a shutdown
//! bounded by a grace period ([`open_and_serve_with`]).
//!
//! Storage sits behind [`KeyStore`], one file per backend: [`sqlite::SqliteStore`],
//! [`mysql::MysqlStore`] and [`postgres::PostgresStore`]. The tables (`leasehold_target_key`,
//! `leasehold_target_effect`, `leasehold_target_counter`) are created by the target
//! itself, never by the ledger's migrations, so they may live in any database,
//! the ledger's included. An effects table created before effect rows kept their
//! request's path gets its `path` column when a store opens it.

mod concurrency;
pub mod mysql;
pub mod postgres;
mod server;
pub mod sqlite;

pub use concurrency::MAX_TRACKED_PATHS;
pub use server::{Faults, Target, MAX_DELAY, MAX_FAILED_KEYS};

use crate::ledger::DbUrl;
use crate::listener::Served;
use serde::Serialize;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

/// How long a claim on a key holds before a repeat of the same request may take it
/// over, on top of the target's delay: the time a request's work may take at most.
pub const PROCESSING_HOLD: Duration = Duration::from_secs(10);

/// The longest key accepted, in characters.
pub const MAX_KEY_CHARS: usize = 255;

/// The most first applications listed in [`Effects::order_by_path`]: the earliest
/// ones, by effect row id; later applications count in `keys` and `effects` only.
pub const MAX_ORDERED_KEYS: usize = 65_536;

/// The query every store reads [`Effects::order_by_path`] with: `(path, key)` of each
/// key's first effect row, in the order of their ids, for the first
/// [`MAX_ORDERED_KEYS`]. Rows written before the path was stored (`NULL`) are left
/// out.
fn order_query() -> String {
    format!(
        "SELECT e.path, e.idempotency_key FROM leasehold_target_effect e
         WHERE e.path IS NOT NULL AND NOT EXISTS (
             SELECT 1 FROM leasehold_target_effect f
             WHERE f.idempotency_key = e.idempotency_key AND f.id < e.id)
         ORDER BY e.id LIMIT {MAX_ORDERED_KEYS}"
    )
}

/// Groups the rows of [`order_query`] (in their order) by path.
fn order_by_path(rows: impl IntoIterator<Item = (String, String)>) -> BTreeMap<String, Vec<String>> {
    let mut by_path: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, key) in rows {
        by_path.entry(path).or_default().push(key);
    }
    by_path
}

/// What a store answers when a request claims a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begun {
    /// The key was free (new, or its earlier claim expired with the same
    /// fingerprint): this request holds it and must apply it with this claim.
    Claimed(Claim),
    /// The key was applied before; its fingerprint and stored response.
    Done {
        /// The SHA-256 (hex) of the body that applied it.
        body_sha256: String,
        /// What that request was answered.
        response: StoredResponse,
    },
    /// Another request holds the key and has not finished.
    Processing {
        /// The SHA-256 (hex) of that request's body.
        body_sha256: String,
    },
}

/// A request's hold on a key, until it applies it or the hold expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The key.
    pub key: String,
    /// The token that guards the apply: whoever took the key over since has
    /// another.
    pub token: String,
}

/// A response as stored for a key, replayed to every repeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoredResponse {
    /// The HTTP status.
    pub status: u16,
    /// The JSON body, as text.
    pub body: String,
}

/// A request outcome counted by the store (they survive restarts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// A repeat answered with the stored response.
    Replay,
    /// A repeat answered 409 (the key was still being processed).
    Conflict,
    /// A repeat answered 422 (the key was used with another body).
    Mismatch,
}

impl Counted {
    /// The counter's name in the store and in [`Effects`].
    pub fn name(self) -> &'static str {
        match self {
            Counted::Replay => "replays",
            Counted::Conflict => "conflicts",
            Counted::Mismatch => "mismatches",
        }
    }

    /// Every counter.
    pub const ALL: [Counted; 3] = [Counted::Replay, Counted::Conflict, Counted::Mismatch];
}

/// What the target has done, from the store: the answer of `GET /effects`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Effects {
    /// Keys applied (done).
    pub keys: u64,
    /// Keys claimed and not yet applied.
    pub in_progress: u64,
    /// Effect rows: equal to `keys` when every key was applied once.
    pub effects: u64,
    /// Repeats answered with the stored response.
    pub replays: u64,
    /// Repeats answered 409 (still processing).
    pub conflicts: u64,
    /// Repeats answered 422 (another body).
    pub mismatches: u64,
    /// Effect rows per key: 1 for every key when each was applied exactly once.
    pub by_key: BTreeMap<String, u64>,
    /// Per request path (without its query), the keys in the order they were first
    /// applied there; a replay appends nothing. From the store, for the first
    /// [`MAX_ORDERED_KEYS`] applications.
    #[serde(default)]
    pub order_by_path: BTreeMap<String, Vec<String>>,
    /// The most deliveries this process was processing at once since it started
    /// (not stored).
    #[serde(default)]
    pub max_concurrent: u64,
    /// The same per request path (without its query), for the first
    /// [`MAX_TRACKED_PATHS`] paths met (not stored).
    #[serde(default)]
    pub max_concurrent_by_path: BTreeMap<String, u64>,
    /// Faults injected by this process since it started (not stored).
    pub faults: FaultCounts,
}

/// Faults injected since the target process started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FaultCounts {
    /// Requests answered 503 before anything was done (`--fail-rate`).
    pub failed: u64,
    /// Those requests per `Idempotency-Key` (for the first
    /// [`MAX_FAILED_KEYS`] keys that met one).
    #[serde(default)]
    pub failed_by_key: BTreeMap<String, u64>,
    /// Requests whose effect was applied and whose connection was then closed
    /// without a reply (`--drop-reply-rate`).
    pub dropped_replies: u64,
}

/// Why a store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database could not be reached or was busy; nothing is known to have been
    /// written. The request is answered 500 and may be retried.
    #[error("target store unavailable: {0}")]
    Unavailable(String),
    /// The database URL or its content is not usable.
    #[error("target store: {0}")]
    Invalid(String),
}

/// Durable storage of keys, effects and counters. Every method is atomic with
/// respect to concurrent calls for the same key, from this process or any other
/// sharing the database.
pub trait KeyStore: Send + Sync + 'static {
    /// Claims `key` for a request whose body hashes to `body_sha256` (hex), at
    /// `now_ms` (Unix milliseconds), for `hold_ms`: inserts it as processing when it
    /// is new, takes over an expired claim with the same fingerprint, and otherwise
    /// answers what the key holds.
    fn begin(
        &self,
        key: &str,
        body_sha256: &str,
        now_ms: u64,
        hold_ms: u64,
    ) -> impl Future<Output = Result<Begun, StoreError>> + Send;

    /// In one transaction: when `claim` still holds its key, records the effect
    /// (`receipt_id` names it, `path` is the request's path without its query) and
    /// stores `response` as the key's answer; answers whether it did. `false`: the
    /// claim was taken over, nothing was written.
    fn apply(
        &self,
        claim: &Claim,
        receipt_id: &str,
        path: &str,
        response: &StoredResponse,
        now_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Adds one to a counter.
    fn count(&self, counted: Counted) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A consistent reading of keys, effects, their order and counters (`faults` and
    /// the concurrency fields left zero).
    fn effects(&self) -> impl Future<Output = Result<Effects, StoreError>> + Send;
}

/// Opens the store a database URL names (`sqlite://FILE`, `sqlite::memory:`,
/// `mysql://…` or `postgres://…`), creating the target's tables, and serves `target`'s receiver on
/// `listener` until `shutdown` resolves. `on_ready` is called with a description
/// of the store (never a password) once it is open and before the first request is
/// accepted. The listener has the default [`crate::listener::Config`]; see
/// [`open_and_serve_with`].
pub async fn open_and_serve(
    db: &DbUrl,
    faults: Faults,
    listener: tokio::net::TcpListener,
    on_ready: impl FnOnce(&str),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StoreError> {
    let config = crate::listener::Config::default();
    open_and_serve_with(db, faults, config, listener, on_ready, shutdown)
        .await
        .map(|_| ())
}

/// [`open_and_serve`] with the listener's timeouts, connection cap, allowed hosts
/// and grace period from `config`; answers what the listener counted.
pub async fn open_and_serve_with(
    db: &DbUrl,
    faults: Faults,
    config: crate::listener::Config,
    listener: tokio::net::TcpListener,
    on_ready: impl FnOnce(&str),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Served, StoreError> {
    let serve_error = |e: std::io::Error| StoreError::Unavailable(format!("cannot serve: {e}"));
    match db {
        DbUrl::Sqlite(path) => {
            let store = sqlite::SqliteStore::open(path)?;
            if path == ":memory:" {
                on_ready("sqlite::memory: (not durable: every key is forgotten when the target stops)");
            } else {
                on_ready(&format!("sqlite://{path}"));
            }
            Target::new(store, faults)
                .serve_with(listener, config, shutdown)
                .await
                .map_err(serve_error)
        }
        DbUrl::Mysql(url) => {
            let store = mysql::MysqlStore::open(url).await?;
            on_ready(&url.to_string());
            Target::new(store, faults)
                .serve_with(listener, config, shutdown)
                .await
                .map_err(serve_error)
        }
        DbUrl::Postgres(url) => {
            let store = postgres::PostgresStore::open(url).await?;
            on_ready(&url.to_string());
            Target::new(store, faults)
                .serve_with(listener, config, shutdown)
                .await
                .map_err(serve_error)
        }
    }
}
