//! `leasehold serve`: the HTTP API (`/api/v1`), the web console, Prometheus metrics
//! and, optionally, in-process workers, on one axum server.
//!
//! - [`api`]: JSON routes under `/api/v1`, errors as `application/problem+json`
//!   ([`problem`]), the OpenAPI document generated from the handlers
//!   ([`api::openapi`], served at `/api/v1/openapi.json`).
//! - [`console`]: server-rendered pages with one small script (live polling), its
//!   assets embedded in the binary.
//! - [`auth`]: API tokens with roles ([`crate::tokens`]), console sessions, CSRF
//!   and security headers.
//! - [`metrics`] and [`logs`]: `/metrics` and structured `tracing` logs.
//!
//! The handlers reach the ledger only through [`Backend`], implemented for every
//! [`Ledger`] that is also a [`TokenStore`]. Responses never hold a lease token
//! (`Command` does not serialize it), an API token (only created, never answered),
//! nor the database URL or password (never given to the handlers; error texts that
//! could name the database are logged redacted and answered generically).

pub mod api;
pub mod auth;
mod backend;
pub mod console;
pub mod logs;
pub mod metrics;
pub mod problem;

pub use backend::Backend;

use crate::clock::{Clock, SystemClock};
use crate::executor::Executor;
use crate::ledger::listing::COUNT_CAP_DEFAULT;
use crate::ledger::Ledger;
use crate::tokens::TokenStore;
use crate::worker::{RunOptions, Worker, WorkerReport};
use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
use leasehold_engine::lease::WorkerConfig;
use sha2::{Digest, Sha256};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// The largest request body the server reads (a plan is at most
/// [`leasehold_engine::plan::MAX_PLAN_FILE_BYTES`]).
pub const BODY_LIMIT_BYTES: usize = 1024 * 1024;

pub(crate) fn sha256(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

struct Inner {
    backend: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    sessions: auth::Sessions,
    metrics: Arc<metrics::Metrics>,
    known_executors: Vec<String>,
    count_cap: u64,
}

/// The server's shared state: the ledger, sessions and metrics. Cheap to clone.
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").finish_non_exhaustive()
    }
}

impl App {
    /// A server over `ledger`, registering plans against `known_executors` and
    /// deciding "time left" on the system clock.
    pub fn new<L: Ledger + TokenStore>(ledger: Arc<L>, known_executors: &[&str]) -> Self {
        Self::with_clock(ledger, known_executors, Arc::new(SystemClock))
    }

    /// [`App::new`] with another clock for the console's "time left".
    pub fn with_clock<L: Ledger + TokenStore>(ledger: Arc<L>, known_executors: &[&str], clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: Arc::new(Inner {
                backend: ledger,
                clock,
                sessions: auth::Sessions::default(),
                metrics: Arc::new(metrics::Metrics::new()),
                known_executors: known_executors.iter().map(|s| (*s).to_owned()).collect(),
                count_cap: COUNT_CAP_DEFAULT,
            }),
        }
    }

    /// This server with every count capped at `cap` instead of
    /// [`COUNT_CAP_DEFAULT`]. Call before cloning.
    pub fn with_count_cap(mut self, cap: u64) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.count_cap = cap.max(1);
        }
        self
    }

    /// The ledger.
    pub fn backend(&self) -> &dyn Backend {
        self.inner.backend.as_ref()
    }

    /// Console sessions and login codes.
    pub fn sessions(&self) -> &auth::Sessions {
        &self.inner.sessions
    }

    /// The metrics (in-process workers record into them: [`metrics::Metrics::observer`]).
    pub fn metrics(&self) -> &Arc<metrics::Metrics> {
        &self.inner.metrics
    }

    /// Now, on the server's clock.
    pub fn now(&self) -> leasehold_engine::Timestamp {
        self.inner.clock.now()
    }

    /// The executor names plans are validated against.
    pub fn known_executors(&self) -> Vec<&str> {
        self.inner.known_executors.iter().map(String::as_str).collect()
    }

    /// The cap of every count.
    pub fn count_cap(&self) -> u64 {
        self.inner.count_cap
    }

    /// A one-time login link's path (`/login?code=…`) for the token with this hash.
    pub fn login_path(&self, token_hash: String) -> Result<String, problem::Problem> {
        let code = self.sessions().login_code(token_hash, Instant::now())?;
        Ok(format!("/login?code={code}"))
    }
}

/// Logs each request: method, route path (never the query string or headers),
/// status and duration; `info` for changes and errors, `debug` for reads.
async fn access_log(request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let ms = started.elapsed().as_millis() as u64;
    let path = crate::text::clean(&path).into_owned();
    if method == axum::http::Method::GET && status < 400 {
        tracing::debug!(event = "http", method = %method, path = %path, status, ms, "request");
    } else {
        tracing::info!(event = "http", method = %method, path = %path, status, ms, "request");
    }
    response
}

/// The whole server: API, console, `/metrics` and assets, behind the CSRF guard,
/// the security headers and the access log.
pub fn router(app: App) -> Router {
    let (api, _) = api::routes().split_for_parts();
    Router::new()
        .merge(api)
        .merge(console::routes())
        .route("/metrics", axum::routing::get(api::metrics_authenticated))
        .fallback(console::not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        .layer(middleware::from_fn(auth::csrf_guard))
        .layer(middleware::from_fn(auth::security_headers))
        .layer(middleware::from_fn(access_log))
        .with_state(app)
}

/// The private scrape port's server (`--metrics-listen`): `/metrics` without
/// authentication, nothing else.
pub fn metrics_router(app: App) -> Router {
    Router::new()
        .route("/metrics", axum::routing::get(api::metrics_open))
        .with_state(app)
}

/// How `serve` runs its in-process workers.
#[derive(Debug, Clone)]
pub struct WorkerPool {
    /// How many (0: the server only serves).
    pub workers: u32,
    /// Each worker's configuration.
    pub config: WorkerConfig,
    /// The lease owner prefix (`-1`, `-2`, … appended).
    pub id: String,
    /// How long in-flight deliveries get after a stop.
    pub grace_ms: u64,
    /// The time budget of each step.
    pub step_timeout: Duration,
}

/// What a server run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServeReport {
    /// The workers' reports, summed.
    pub workers: WorkerReport,
}

/// Serves `app` on `listener` (and `/metrics` alone on `metrics`, if given) with
/// `pool`'s workers delivering from `ledger`, until `stop` resolves: then the
/// listeners stop accepting, requests in flight finish, and the workers drain
/// within their grace period.
pub async fn run<L: Ledger, E: Executor>(
    app: App,
    ledger: Arc<L>,
    executor: Arc<E>,
    listener: TcpListener,
    metrics: Option<TcpListener>,
    pool: WorkerPool,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<ServeReport> {
    let (stopped, watch) = tokio::sync::watch::channel(false);
    let stopping = move || {
        let mut watch = watch.clone();
        async move {
            let _ = watch.wait_for(|s| *s).await;
        }
    };
    let mut workers = tokio::task::JoinSet::new();
    for n in 1..=pool.workers {
        let id = format!("{}-{n}", pool.id);
        let worker = Worker::new(
            id.clone(),
            Arc::clone(&ledger),
            Arc::clone(&executor),
            Arc::new(SystemClock),
            pool.config,
        )
        .with_step_timeout(pool.step_timeout)
        .on_event(app.metrics().observer(&id));
        let options = RunOptions {
            until_idle: false,
            grace_ms: pool.grace_ms,
        };
        let stop = stopping();
        workers.spawn(async move { worker.run(stop, options).await });
    }
    let pruner = tokio::spawn(auth::prune_until(app.clone(), auth::PRUNE_EVERY, stopping()));
    let scrape = metrics.map(|listener| {
        let router = metrics_router(app.clone());
        let stop = stopping();
        tokio::spawn(async move { axum::serve(listener, router).with_graceful_shutdown(stop).await })
    });
    let server = axum::serve(listener, router(app)).with_graceful_shutdown(stopping());
    let stopped = Arc::new(stopped);
    let signal = {
        let stopped = Arc::clone(&stopped);
        tokio::spawn(async move {
            stop.await;
            tracing::info!(event = "stopping", "stop requested: draining requests and workers");
            let _ = stopped.send(true);
        })
    };
    let served = server.await;
    // Whatever ended the server (a stop, or an error), the workers drain now.
    let _ = stopped.send(true);
    let mut report = ServeReport::default();
    while let Some(done) = workers.join_next().await {
        if let Ok(r) = done {
            report.workers.claimed += r.claimed;
            report.workers.delivered += r.delivered;
            report.workers.failed += r.failed;
            report.workers.refused += r.refused;
            report.workers.abandoned += r.abandoned;
        }
    }
    if let Some(scrape) = scrape {
        let _ = scrape.await;
    }
    let _ = pruner.await;
    signal.abort();
    served.map(|()| report)
}
