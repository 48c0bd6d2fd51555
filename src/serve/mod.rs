//! `leasehold serve`: the HTTP API (`/api/v1`), the web console, Prometheus metrics
//! and, optionally, in-process workers, on one axum router served by
//! [`crate::listener`] (header and request timeouts, a connection cap, a `Host`
//! check against DNS rebinding, and a shutdown bounded by the grace period).
//!
//! - [`api`]: JSON routes under `/api/v1`, errors as `application/problem+json`
//!   ([`problem`]), the OpenAPI document generated from the handlers
//!   ([`api::openapi`], served at `/api/v1/openapi.json`).
//! - [`console`]: server-rendered pages with one small script (live polling), its
//!   assets embedded in the binary.
//! - [`auth`]: API tokens with roles ([`crate::tokens`]), console sessions, CSRF
//!   and security headers.
//! - [`metrics`] and [`logs`]: `/metrics` and structured `tracing` logs.
//! - [`when`]: the RFC 3339 instants and short durations requests carry.
//!
//! A request that would change something (any method but GET, HEAD and OPTIONS,
//! other than the login form's POST) from a caller without a valid token or session
//! reaches its handler with an empty body: the client's body is never read before
//! authentication, and the handler answers 401 from the headers alone.
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
pub mod otlp;
pub mod problem;
pub mod when;

pub use backend::Backend;

use crate::clock::{Clock, SystemClock};
use crate::executor::Executor;
use crate::ledger::listing::COUNT_CAP_DEFAULT;
use crate::ledger::Ledger;
use crate::listener::Served;
use crate::tokens::TokenStore;
use crate::worker::{RunOptions, Worker, WorkerReport};
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, Method};
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

/// Keeps the body of a state-changing request from a caller without credentials
/// away from its handler (see the module): the handler sees an empty body and
/// refuses the request on its headers, so nothing the client sends is buffered.
async fn no_body_before_authentication(State(app): State<App>, request: Request, next: Next) -> Response {
    let safe = matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if safe || request.uri().path() == "/login" || matches!(app.principal(request.headers()).await, Ok(Some(_))) {
        return next.run(request).await;
    }
    let (mut parts, _unread) = request.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::TRANSFER_ENCODING);
    next.run(Request::from_parts(parts, Body::empty())).await
}

/// The whole server: API, console, `/metrics` and assets, behind the CSRF guard,
/// the security headers and the access log; a body is read only once its request
/// is authenticated (but the login form's).
pub fn router(app: App) -> Router {
    let (api, _) = api::routes().split_for_parts();
    Router::new()
        .merge(api)
        .merge(console::routes())
        .route("/metrics", axum::routing::get(api::metrics_authenticated))
        .fallback(console::not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        .layer(middleware::from_fn_with_state(
            app.clone(),
            no_body_before_authentication,
        ))
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

/// Where `serve` listens, and the bounds of its connections.
#[derive(Debug)]
pub struct Listeners {
    /// The API and console.
    pub api: TcpListener,
    /// `/metrics` alone, without authentication (a private scrape port), if given.
    pub metrics: Option<TcpListener>,
    /// Timeouts, connection cap (for each listener), allowed hosts and the grace
    /// period of both listeners.
    pub config: crate::listener::Config,
}

/// What a server run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServeReport {
    /// The workers' reports, summed.
    pub workers: WorkerReport,
    /// The API and console listener's connections.
    pub api: Served,
    /// The metrics listener's connections (zero without one).
    pub metrics: Served,
}

/// Serves `app` on `listeners` with `pool`'s workers delivering from `ledger`,
/// until `stop` resolves: then the listeners close, requests in flight finish and
/// the workers drain, all within the grace period (connections still open when it
/// ends are closed; see [`crate::listener`]).
pub async fn run<L: Ledger, E: Executor>(
    app: App,
    ledger: Arc<L>,
    executor: Arc<E>,
    listeners: Listeners,
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
        let stop = stopping();
        let (worker, options) = pool.worker(n, &app, &ledger, &executor);
        workers.spawn(async move { worker.run(stop, options).await });
    }
    let pruner = tokio::spawn(auth::prune_until(app.clone(), auth::PRUNE_EVERY, stopping()));
    let config = listeners.config;
    let scrape = listeners.metrics.map(|listener| {
        let (router, config, stop) = (metrics_router(app.clone()), config.clone(), stopping());
        tokio::spawn(async move { crate::listener::serve(listener, router, config, stop).await })
    });
    let signal = tokio::spawn(async move {
        stop.await;
        tracing::info!(event = "stopping", "stop requested: draining requests and workers");
        let _ = stopped.send(true);
    });
    let mut report = ServeReport {
        api: crate::listener::serve(listeners.api, router(app), config, stopping()).await,
        ..ServeReport::default()
    };
    while let Some(done) = workers.join_next().await {
        if let Ok(r) = done {
            report.workers.claimed += r.claimed;
            report.workers.delivered += r.delivered;
            report.workers.failed += r.failed;
            report.workers.refused += r.refused;
            report.workers.abandoned += r.abandoned;
            report.workers.gave_back += r.gave_back;
        }
    }
    if let Some(scrape) = scrape {
        report.metrics = scrape.await.unwrap_or_default();
    }
    let _ = pruner.await;
    signal.abort();
    Ok(report)
}

impl WorkerPool {
    /// The `n`th in-process worker, recording into `app`'s metrics, and how it runs.
    fn worker<L: Ledger, E: Executor>(
        &self,
        n: u32,
        app: &App,
        ledger: &Arc<L>,
        executor: &Arc<E>,
    ) -> (Worker<L, E, SystemClock>, RunOptions) {
        let id = format!("{}-{n}", self.id);
        let worker = Worker::new(
            id.clone(),
            Arc::clone(ledger),
            Arc::clone(executor),
            Arc::new(SystemClock),
            self.config,
        )
        .with_step_timeout(self.step_timeout)
        .on_event(app.metrics().observer(&id));
        let options = RunOptions {
            until_idle: false,
            grace_ms: self.grace_ms,
        };
        (worker, options)
    }
}
