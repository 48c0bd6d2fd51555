//! Argument parsing and dispatch for the `leasehold` binary. Everything it prints
//! goes through [`output`], so a closed pipe ends a command quietly.

#[macro_use]
mod output;

mod bench;
mod config;
mod limits;
mod prune;
mod recovery;
mod render;
mod when;

use clap::{Parser, Subcommand, ValueEnum};
use leasehold::clock::SystemClock;
use leasehold::entropy::OsEntropy;
use leasehold::executor::{Executors, HttpConfig};
use leasehold::ledger::sqlite::{OpenMode, SqliteLedger};
use leasehold::ledger::{find_plan, DbUrl, EnqueueRequest, Ledger, LedgerError};
use leasehold::report;
use leasehold::serve::logs::LogFormat;
use leasehold::tokens::{create_token, Role, TokenStore};
use leasehold::worker::{RunOptions, Worker, WorkerEvent};
use leasehold_engine::evidence::{compare, latest_successful_pair};
use leasehold_engine::gate::gate;
use leasehold_engine::lease::WorkerConfig;
use leasehold_engine::transition::ReconcileOutcome;
use leasehold_engine::{Action, AttemptId, PlanSpec, TraceContext};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// The ranges the numeric flags of `worker`, `serve` and `target` are clamped to,
/// `(min, max)`; a configuration file's value outside one is refused instead.
mod bounds {
    pub(super) const LEASE_SECS: (u64, u64) = (1, 86_400);
    pub(super) const POLL_SECS: (u64, u64) = (1, 3_600);
    pub(super) const GRACE_SECS: (u64, u64) = (0, 3_600);
    pub(super) const STEP_TIMEOUT_SECS: (u64, u64) = (1, 86_400);
    pub(super) const MAX_CONNECTIONS: (usize, usize) = (1, 65_536);

    /// `secs` within `bounds`, in milliseconds.
    pub(super) fn ms((min, max): (u64, u64), secs: u64) -> u64 {
        secs.clamp(min, max) * 1_000
    }
}

/// The rehearsal plan shipped with leasehold, used by `demo`.
const REHEARSAL_PLAN: &str = include_str!("../../scenarios/plans/rehearsal.toml");

/// What `--version` prints after the name: the release, and the schema version
/// each backend's migrations bring a database to (the newest this binary knows;
/// `migrate` prints the versions it applies).
fn version() -> &'static str {
    use leasehold::ledger::migrate::{Migration, SQLITE};
    use leasehold::ledger::{mysql, postgres};
    static LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let newest = |migrations: &[Migration]| migrations.last().map_or(0, |m| m.version);
    LINE.get_or_init(|| {
        format!(
            "{} (schema: sqlite {}, postgres {}, mysql {})",
            env!("CARGO_PKG_VERSION"),
            newest(SQLITE),
            newest(postgres::schema::MIGRATIONS),
            newest(mysql::schema::MIGRATIONS)
        )
    })
}

#[derive(Parser, Debug)]
#[command(
    name = "leasehold",
    version = version(),
    about = "A durable, lease-fenced outbox for multi-step deliveries"
)]
#[command(
    after_help = "Exit codes: 0 ok, 1 internal error, 2 bad input, 3 refused, 4 gate blocked or archive tampered, 141 output closed by its reader."
)]
struct Cli {
    /// Database URL: sqlite://FILE (relative or absolute path), sqlite::memory:, or
    /// mysql://USER[:PASSWORD]@HOST[:PORT]/DB[?pool_max=N&connect_timeout_ms=N…] (MySQL, MariaDB), or
    /// postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?pool_max=N&statement_timeout_ms=N&sslmode=…].
    #[arg(
        long,
        global = true,
        env = "LEASEHOLD_DB",
        default_value = "sqlite://leasehold.db",
        hide_env_values = true
    )]
    db: String,
    /// A configuration file (TOML, see docs/configuration.md): settings that flags and
    /// LEASEHOLD_* variables leave unset.
    #[arg(long, global = true, value_name = "FILE", env = "LEASEHOLD_CONFIG")]
    config: Option<PathBuf>,
    /// Print reads as JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create or upgrade the database schema (idempotent).
    Migrate,
    /// Register, list, show and retire plans.
    #[command(subcommand)]
    Plan(PlanCommand),
    /// Enqueue an attempt of a plan, now or for later; prints the attempt id.
    Enqueue {
        /// Plan id or name.
        plan: String,
        /// What the attempt does.
        #[arg(long, value_enum, default_value_t = ActionArg::Execute)]
        action: ActionArg,
        #[command(flatten)]
        start: recovery::StartArgs,
        /// The W3C trace context the attempt joins (`00-<trace id>-<span id>-<flags>`);
        /// without it, the attempt starts a trace of its own.
        #[arg(long, value_name = "TRACEPARENT", value_parser = parse_traceparent)]
        traceparent: Option<TraceContext>,
        /// An enqueue key (1 to 255 characters): run again with the same key and the
        /// same request, it answers the attempt the first run created instead of
        /// enqueuing another; with another request, it is refused (exit 2).
        #[arg(long, value_name = "KEY", value_parser = parse_enqueue_key)]
        key: Option<String>,
        /// A template's input: a JSON object of the fields its `[input]` declares, or
        /// `@FILE` to read it from a file. Checked, resolved into the steps' payloads
        /// and frozen on the attempt.
        #[arg(long, value_name = "JSON|@FILE", value_parser = parse_input)]
        input: Option<serde_json::Value>,
        /// A template's order key (1 to 255 characters): attempts with the same key
        /// run one at a time, in enqueue order.
        #[arg(long = "order-key", value_name = "KEY", value_parser = parse_order_key)]
        order_key: Option<String>,
    },
    /// Claim and deliver commands until stopped (SIGINT/SIGTERM) or idle.
    Worker {
        /// Lease owner name recorded on claimed commands.
        #[arg(long)]
        id: Option<String>,
        /// Lease length in seconds (clamped to 1..=86400).
        #[arg(long, default_value_t = 60)]
        lease_secs: u64,
        /// Seconds between polls when idle (clamped to 1..=3600).
        #[arg(long, default_value_t = 5)]
        poll_secs: u64,
        /// Deliveries in flight, claimed per poll (clamped to 1..=256); the write
        /// that ends one claims the next.
        #[arg(long, default_value_t = 5)]
        batch: u32,
        /// Exit once no attempt this worker could run (its executors, allowed hosts and
        /// queues) is QUEUED or RUNNING.
        #[arg(long)]
        until_idle: bool,
        /// Seconds in-flight deliveries get to finish after SIGINT/SIGTERM (clamped to 0..=3600).
        #[arg(long, default_value_t = 30)]
        grace_secs: u64,
        /// Seconds one step may run before it is stopped and fails (clamped to 1..=86400).
        #[arg(long, default_value_t = 300)]
        step_timeout_secs: u64,
        /// Bytes one step's evidence and target receipt may take (canonical JSON); a
        /// step over it fails (clamped to 1024..=16777216).
        #[arg(long, default_value_t = leasehold_engine::lease::MAX_EVIDENCE_BYTES)]
        max_evidence_bytes: usize,
        /// Take work of this queue (repeatable); without it, of the default queue,
        /// where plans that name no queue go.
        #[arg(long = "queue", value_name = "NAME")]
        queues: Vec<String>,
        #[command(flatten)]
        http: HttpArgs,
        #[command(flatten)]
        prune: prune::PeriodicArgs,
        #[command(flatten)]
        traces: TracesArgs,
    },
    /// Show an attempt: its command, lease and receipts (never the lease token).
    Status {
        /// Attempt id.
        attempt: String,
    },
    /// List every attempt of a plan.
    History {
        /// Plan id or name.
        plan: String,
    },
    /// Requeue an attempt whose lease expired (refused while the lease is live).
    Reconcile {
        /// Attempt id.
        attempt: String,
    },
    /// Abort a QUEUED or RUNNING attempt, fencing its worker; or, with --open, the
    /// open attempts a filter selects.
    Abort(recovery::AbortArgs),
    /// Retry a FAILED or ABORTED attempt (enqueue a retry of its plan); or, with
    /// --failed, the failed attempts a filter selects.
    Retry(recovery::RetryArgs),
    /// Compare two successful attempts of a plan (default: the two latest).
    Compare {
        /// Plan id or name.
        plan: String,
        /// The left (older) attempt.
        #[arg(long, requires = "right")]
        left: Option<String>,
        /// The right (newer) attempt.
        #[arg(long, requires = "left")]
        right: Option<String>,
    },
    /// Compute the release gate of a plan from its durable evidence (exit 0 PASS, 4 BLOCK).
    Gate {
        /// Plan id or name.
        plan: String,
    },
    /// Run the rehearsal plan twice (embedded SQLite by default) and show outcomes, comparison and gate.
    Demo {
        #[command(flatten)]
        http: HttpArgs,
        /// Then serve the console and API on --listen with the demo's data.
        #[arg(long)]
        serve: bool,
        /// Where `--serve` listens.
        #[arg(long, default_value = "127.0.0.1:8080", requires = "serve")]
        listen: String,
    },
    /// Serve the HTTP API (/api/v1), the web console and /metrics, with in-process workers.
    Serve(ServeArgs),
    /// Add, list and revoke API tokens for `serve`.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Measure end-to-end dry-run deliveries on this database (writes bench plans to it).
    ///
    /// Prints deliveries/s, transactions per attempt, latency and the exactly-once check
    /// (exit code 1 if it fails). On SQLite it also prints how many transactions the
    /// writer thread committed, how many calls each held (group commit) and, on Linux,
    /// the writer thread's CPU time per delivery and its share of the run. On MySQL or
    /// MariaDB it prints what the server counted per delivery (statements, commits,
    /// fsyncs, rows) and, when the server runs on this machine, its CPU over the
    /// deliveries.
    Bench(bench::BenchArgs),
    /// Serve the reference idempotent HTTP receiver, storing its keys in --db (its own tables).
    Target(TargetArgs),
    /// Set, list, clear and apply per-target limits: leases in flight, a rate and a
    /// circuit breaker per target (see docs/limits.md).
    #[command(subcommand)]
    Limits(limits::LimitsCommand),
    /// Check a configuration file, or show the effective settings (docs/configuration.md).
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Delete old ended attempts with their receipts and commands, in batches,
    /// optionally archiving them first (see docs/retention.md).
    Prune(prune::PruneArgs),
    /// Check an archive that `prune --archive` wrote.
    #[command(subcommand)]
    Archive(prune::ArchiveCommand),
}

/// `leasehold target`: where it listens and which faults it injects.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Every request but GET /effects is a delivery keyed by its Idempotency-Key header: \
the first applies its effect and stores its response, a repeat with the same body gets that response \
(Idempotent-Replayed: true), with another body 422, while the first is still processing 409, \
without the header 400. GET /effects answers keys, effects, replays, conflicts and by_key as JSON. \
Stops on SIGINT/SIGTERM. See docs/target.md."
)]
struct TargetArgs {
    /// The address to listen on (port 0: any free port; the bound address is printed).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: String,
    /// The share of first applications whose connection is closed without a reply,
    /// after the effect is committed (0 to 1).
    #[arg(long, value_name = "R", default_value_t = 0.0, allow_negative_numbers = true)]
    drop_reply_rate: f64,
    /// The share of deliveries answered 503 before anything is done (0 to 1).
    #[arg(long, value_name = "R", default_value_t = 0.0, allow_negative_numbers = true)]
    fail_rate: f64,
    /// --fail-rate applies only this long after the start (500ms, 30s, 10m, 1h),
    /// then the target is healthy: a receiver that is down for a while.
    #[arg(long, value_name = "DURATION", requires = "fail_rate", allow_hyphen_values = true)]
    fail_for: Option<String>,
    /// Milliseconds a first request works while it holds its key (a repeat then gets
    /// 409), and a replay waits before it is answered (at most 60000).
    #[arg(long, value_name = "N", default_value_t = 0)]
    delay_ms: u64,
    /// Seeds the fault draws (default: a random seed, printed).
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Seconds requests in flight get to finish after SIGINT/SIGTERM; connections
    /// still open then are closed (clamped to 0..=3600).
    #[arg(long, default_value_t = 10)]
    grace_secs: u64,
    #[command(flatten)]
    connections: ListenArgs,
}

/// The export of delivery spans, on `serve` and `worker`.
#[derive(clap::Args, Debug, Default)]
struct TracesArgs {
    /// Export the spans of enqueues, claims, steps and ending writes over OTLP/HTTP
    /// (JSON) to this collector base URL, e.g. http://127.0.0.1:4318 (spans go to
    /// /v1/traces). Off without it.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
}

impl TracesArgs {
    /// The exporter the flag asks for, if any.
    fn exporter(&self) -> Result<Option<leasehold::serve::otlp::Exporter>, Failure> {
        self.otlp_endpoint
            .as_deref()
            .map(leasehold::serve::otlp::Exporter::new)
            .transpose()
            .map_err(Failure::bad_input)
    }
}

/// The listener's bounds, on `serve` and `target`.
#[derive(clap::Args, Debug)]
struct ListenArgs {
    /// Connections open at once; more are answered 503 and closed at once (clamped to 1..=65536).
    #[arg(long, value_name = "N", default_value_t = leasehold::listener::MAX_CONNECTIONS_DEFAULT)]
    max_connections: usize,
    /// An origin clients reach this server at, http(s)://HOST[:PORT], whose host is
    /// answered besides IP addresses and localhost (repeatable; also
    /// LEASEHOLD_PUBLIC_ORIGIN, comma-separated). Any other Host header gets 421.
    #[arg(
        long = "public-origin",
        value_name = "URL",
        env = "LEASEHOLD_PUBLIC_ORIGIN",
        value_delimiter = ','
    )]
    public_origins: Vec<String>,
}

impl ListenArgs {
    fn defaults() -> Self {
        Self {
            max_connections: leasehold::listener::MAX_CONNECTIONS_DEFAULT,
            public_origins: Vec::new(),
        }
    }

    /// The listener configuration these flags and a grace period make.
    fn config(&self, grace_secs: u64) -> Result<leasehold::listener::Config, Failure> {
        Ok(leasehold::listener::Config {
            max_connections: self
                .max_connections
                .clamp(bounds::MAX_CONNECTIONS.0, bounds::MAX_CONNECTIONS.1),
            grace: Duration::from_millis(bounds::ms(bounds::GRACE_SECS, grace_secs)),
            hosts: leasehold::listener::AllowedHosts::from_origins("--public-origin", &self.public_origins)
                .map_err(Failure::bad_input)?,
            ..leasehold::listener::Config::default()
        })
    }
}

/// The `http:v1` executor's egress allowlist and secret bindings, on `worker`,
/// `serve` and `demo`.
#[derive(clap::Args, Debug, Default)]
struct HttpArgs {
    /// A host the http:v1 executor may call, HOST (the scheme's default port) or
    /// HOST:PORT (repeatable; also LEASEHOLD_HTTP_ALLOW, comma-separated). Every
    /// other host is refused.
    #[arg(
        long = "http-allow",
        value_name = "HOST[:PORT]",
        env = "LEASEHOLD_HTTP_ALLOW",
        value_delimiter = ','
    )]
    allow: Vec<String>,
    /// A secret variable and a host it may be sent to, LEASEHOLD_SECRET_NAME=HOST[:PORT]
    /// (repeatable; also LEASEHOLD_HTTP_SECRET, comma-separated). A secret bound to
    /// no host is sent nowhere.
    #[arg(
        long = "http-secret",
        value_name = "NAME=HOST[:PORT]",
        env = "LEASEHOLD_HTTP_SECRET",
        value_delimiter = ','
    )]
    secrets: Vec<String>,
}

impl HttpArgs {
    /// The executor registry these flags configure; `step_timeout` caps every HTTP
    /// call's own budget, so its retries end before the worker stops the call.
    fn executors(&self, step_timeout: Duration) -> Result<Executors, Failure> {
        let mut config = HttpConfig::allowing(&self.allow)
            .and_then(|c| c.binding(&self.secrets))
            .map_err(Failure::bad_input)?;
        config.budget_cap = step_timeout
            .saturating_sub(Duration::from_millis(500))
            .max(Duration::from_millis(100));
        // Each sandbox in a child process of this binary: a hard memory bound per sandbox.
        let program = std::env::current_exe().map_err(|e| Failure {
            code: 1,
            message: format!("could not find this program to run sandboxes in: {e}"),
        })?;
        let executors = Executors::builder()
            .sandbox(leasehold::executor::SqliteSandbox::isolated(program))
            .http(config)
            .build()
            .map_err(|e| Failure::bad_input(e.to_string()))?;
        executors.http().check_secrets().map_err(Failure::bad_input)?;
        Ok(executors)
    }
}

/// `leasehold serve`'s flags.
#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// Address of the API and console, HOST:PORT (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Also serve /metrics without authentication on this address (a private scrape port).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// In-process workers delivering commands (0: serve only, no polling).
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// Log lines as JSON objects or text, on stderr.
    #[arg(long, value_enum, default_value_t = LogFormatArg::Text)]
    log_format: LogFormatArg,
    /// Lease length in seconds for the workers (clamped to 1..=86400).
    #[arg(long, default_value_t = 60)]
    lease_secs: u64,
    /// Seconds between the workers' polls when idle (clamped to 1..=3600).
    #[arg(long, default_value_t = 2)]
    poll_secs: u64,
    /// Deliveries each worker has in flight, claimed per poll (clamped to 1..=256); the
    /// write that ends one claims the next.
    #[arg(long, default_value_t = 5)]
    batch: u32,
    /// Seconds in-flight deliveries get to finish after SIGINT/SIGTERM (clamped to 0..=3600).
    #[arg(long, default_value_t = 30)]
    grace_secs: u64,
    /// Seconds one step may run before it is stopped and fails (clamped to 1..=86400).
    #[arg(long, default_value_t = 300)]
    step_timeout_secs: u64,
    /// Bytes one step's evidence and target receipt may take (canonical JSON); a
    /// step over it fails (clamped to 1024..=16777216).
    #[arg(long, default_value_t = leasehold_engine::lease::MAX_EVIDENCE_BYTES)]
    max_evidence_bytes: usize,
    #[command(flatten)]
    http: HttpArgs,
    #[command(flatten)]
    connections: ListenArgs,
    #[command(flatten)]
    prune: prune::PeriodicArgs,
    #[command(flatten)]
    traces: TracesArgs,
}

impl ServeArgs {
    /// What `demo --serve` serves with: one worker, the flags' defaults otherwise.
    fn for_demo(listen: String, http: HttpArgs) -> Self {
        Self {
            listen,
            metrics_listen: None,
            workers: 1,
            log_format: LogFormatArg::Text,
            lease_secs: 60,
            poll_secs: 2,
            batch: 5,
            grace_secs: 30,
            step_timeout_secs: 300,
            max_evidence_bytes: leasehold_engine::lease::MAX_EVIDENCE_BYTES,
            http,
            connections: ListenArgs::defaults(),
            prune: prune::PeriodicArgs::default(),
            traces: TracesArgs::default(),
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum LogFormatArg {
    Json,
    Text,
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Create a token and print it once (only its SHA-256 is stored).
    Add {
        /// A unique name: letters, digits, '.', '_' or '-'.
        name: String,
        /// viewer (reads, metrics), operator (+ enqueue, reconcile, abort, retry, compensate), admin (+ plans, tokens).
        #[arg(long, value_enum)]
        role: RoleArg,
    },
    /// List tokens (names, roles, dates; never a secret).
    List,
    /// Revoke a token: it is refused from the next request on.
    Revoke {
        /// The token's name.
        name: String,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum RoleArg {
    Viewer,
    Producer,
    Operator,
    Admin,
}

impl From<RoleArg> for Role {
    fn from(r: RoleArg) -> Self {
        match r {
            RoleArg::Viewer => Role::Viewer,
            RoleArg::Producer => Role::Producer,
            RoleArg::Operator => Role::Operator,
            RoleArg::Admin => Role::Admin,
        }
    }
}

#[derive(Subcommand, Debug)]
enum PlanCommand {
    /// Register a plan from a TOML or JSON file; prints its id and fingerprint.
    Add {
        /// The plan file (.toml or .json).
        file: PathBuf,
    },
    /// List plans.
    List,
    /// Show a plan with its steps.
    Show {
        /// Plan id or name.
        plan: String,
    },
    /// Retire a plan: it accepts no new attempts.
    Retire {
        /// Plan id or name.
        plan: String,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum ActionArg {
    Execute,
    Retry,
    Compensate,
}

impl From<ActionArg> for Action {
    fn from(a: ActionArg) -> Self {
        match a {
            ActionArg::Execute => Action::Execute,
            ActionArg::Retry => Action::Retry,
            ActionArg::Compensate => Action::Compensate,
        }
    }
}

/// A command-line failure with its exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn bad_input(message: impl Into<String>) -> Self {
        Self {
            code: 2,
            message: message.into(),
        }
    }

    /// An exit code whose reason was already printed (a blocked gate).
    fn silent(code: u8) -> Self {
        Self {
            code,
            message: String::new(),
        }
    }
}

impl From<LedgerError> for Failure {
    fn from(e: LedgerError) -> Self {
        let code = match &e {
            // A key is the caller's input: reusing one for another request is a usage error.
            LedgerError::Refused(leasehold_engine::Refusal::KeyReused { .. }) => 2,
            LedgerError::Refused(_) => 3,
            LedgerError::InvalidPlan(_) | LedgerError::NotFound { .. } | LedgerError::BadInput(_) => 2,
            _ => 1,
        };
        Self {
            code,
            message: e.to_string(),
        }
    }
}

type Outcome = Result<(), Failure>;

/// Parses arguments, runs the command, prints a one-line error on failure.
pub fn main() -> ExitCode {
    let cli = match config::parse() {
        Ok(cli) => cli,
        Err(f) => {
            errln!("error: {}", leasehold::text::clean(&f.message));
            return ExitCode::from(f.code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            errln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(dispatch(cli));
    // Steps still on the blocking pool were cancelled when their deliveries were
    // dropped; do not wait long for them.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if !f.message.is_empty() {
                errln!("error: {}", leasehold::text::clean(&f.message));
            }
            ExitCode::from(f.code)
        }
    }
}

/// How a command opens a SQLite ledger: only `migrate`, `demo` and `bench` may
/// create the file, and reads open it read-only.
fn open_mode(command: &Command) -> OpenMode {
    match command {
        Command::Migrate | Command::Demo { .. } | Command::Bench(_) | Command::Serve(_) => OpenMode::Create,
        Command::Token(TokenCommand::List) | Command::Limits(limits::LimitsCommand::List) => OpenMode::ReadOnly,
        Command::Token(TokenCommand::Add { .. } | TokenCommand::Revoke { .. }) => OpenMode::Existing,
        Command::Plan(PlanCommand::List | PlanCommand::Show { .. })
        | Command::Status { .. }
        | Command::History { .. }
        | Command::Compare { .. }
        | Command::Gate { .. } => OpenMode::ReadOnly,
        Command::Plan(PlanCommand::Add { .. } | PlanCommand::Retire { .. })
        | Command::Enqueue { .. }
        | Command::Worker { .. }
        | Command::Reconcile { .. }
        | Command::Abort(_)
        | Command::Retry(_)
        | Command::Limits(_)
        | Command::Prune(_)
        | Command::Target(_)
        | Command::Config(_) => OpenMode::Existing,
        Command::Archive(_) => OpenMode::ReadOnly,
    }
}

async fn dispatch(cli: Cli) -> Outcome {
    register_db_secrets(&cli.db);
    if let Command::Config(command) = &cli.command {
        // Reads the file and the settings only.
        return config::run(command, &cli);
    }
    if let Command::Target(args) = &cli.command {
        // The target keeps its own tables and opens no ledger.
        return serve_target(&cli.db, args).await;
    }
    if let Command::Archive(prune::ArchiveCommand::Verify { file }) = &cli.command {
        // An archive is a file of its own: no ledger is opened.
        return prune::verify(file, cli.json);
    }
    match DbUrl::parse(&cli.db)? {
        DbUrl::Sqlite(path) => {
            let mode = open_mode(&cli.command);
            let ledger = SqliteLedger::open_with(&path, mode, Arc::new(SystemClock), Arc::new(OsEntropy))?;
            run(Arc::new(ledger), cli.command, cli.json).await
        }
        DbUrl::Mysql(url) => {
            let ledger = leasehold::ledger::mysql::MysqlLedger::open(&url, Arc::new(OsEntropy));
            if !schema_ready(&cli.command, || ledger.check_schema()).await? {
                return Ok(());
            }
            run(Arc::new(ledger), cli.command, cli.json).await
        }
        DbUrl::Postgres(url) => {
            let ledger = leasehold::ledger::postgres::PostgresLedger::open(&url, Arc::new(OsEntropy))?;
            if !schema_ready(&cli.command, || ledger.check_schema()).await? {
                return Ok(());
            }
            run(Arc::new(ledger), cli.command, cli.json).await
        }
    }
}

/// Whether `command` may run on a server ledger, once `check` (its schema check)
/// passed; commands that create the schema skip it. A worker waits out a ledger it
/// cannot reach (a database failing over, or starting after its workers): it says
/// so on stderr and asks again after growing pauses (0.1 s, doubling up to 5 s),
/// until the ledger answers or a stop signal comes (then `false`: nothing to run).
/// Any other command fails at once.
async fn schema_ready<F, Fut>(command: &Command, check: F) -> Result<bool, Failure>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), LedgerError>>,
{
    if open_mode(command) == OpenMode::Create {
        return Ok(true);
    }
    if !matches!(command, Command::Worker { .. }) {
        check().await?;
        return Ok(true);
    }
    let mut stop = std::pin::pin!(stop_signal());
    let mut pause = Duration::from_millis(100);
    loop {
        match check().await {
            Ok(()) => return Ok(true),
            Err(e) if e.is_transient() => {
                eprintln!("{e}; retrying in {} ms", pause.as_millis());
                tokio::select! {
                    () = &mut stop => return Ok(false),
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn run<L: Ledger + TokenStore>(ledger: Arc<L>, command: Command, json: bool) -> Outcome {
    match command {
        Command::Migrate => migrate(ledger.as_ref()).await,
        Command::Plan(command) => plan_command(ledger.as_ref(), command, json).await,
        Command::Enqueue {
            plan,
            action,
            start,
            traceparent,
            key,
            input,
            order_key,
        } => {
            let request = EnqueueRequest::new(action.into())
                .traced(traceparent)
                .keyed(key)
                .with_input(input)
                .ordered(order_key);
            recovery::enqueue(ledger.as_ref(), &plan, request, &start, json).await
        }
        Command::Worker {
            id,
            lease_secs,
            poll_secs,
            batch,
            until_idle,
            grace_secs,
            step_timeout_secs,
            max_evidence_bytes,
            queues,
            http,
            prune,
            traces,
        } => {
            let config = WorkerConfig::clamped(
                true,
                bounds::ms(bounds::POLL_SECS, poll_secs),
                batch,
                bounds::ms(bounds::LEASE_SECS, lease_secs),
            )
            .with_max_evidence_bytes(max_evidence_bytes);
            let settings = WorkerSettings {
                until_idle,
                grace_ms: bounds::ms(bounds::GRACE_SECS, grace_secs),
                step_timeout: Duration::from_millis(bounds::ms(bounds::STEP_TIMEOUT_SECS, step_timeout_secs)),
                queues,
            };
            let exporter = traces.exporter()?;
            if exporter.is_some() {
                leasehold::serve::logs::init(None, exporter.as_ref());
            }
            let periodic = prune.checked()?.map(|p| p.spawn(Arc::clone(&ledger)));
            let done = worker_command(ledger, id, config, settings, &http).await;
            if let Some(periodic) = periodic {
                periodic.stop().await;
            }
            exporter.inspect(leasehold::serve::otlp::Exporter::shutdown);
            done
        }
        Command::Status { attempt } => status(ledger.as_ref(), attempt, json).await,
        Command::History { plan } => {
            let plan = find_plan(ledger.as_ref(), &plan).await?;
            let records = ledger.history(&plan.id).await?;
            emit(json, &records, || render::history(&plan, &records));
            Ok(())
        }
        Command::Reconcile { attempt } => reconcile(ledger.as_ref(), attempt, json).await,
        Command::Abort(args) => recovery::abort(ledger.as_ref(), args, json).await,
        Command::Retry(args) => recovery::retry(ledger.as_ref(), args, json).await,
        Command::Compare { plan, left, right } => compare_attempts(ledger.as_ref(), &plan, left, right, json).await,
        Command::Gate { plan } => release_gate(ledger.as_ref(), &plan, json).await,
        Command::Demo {
            http,
            serve: then_serve,
            listen,
        } => {
            demo(Arc::clone(&ledger), &http).await?;
            if then_serve {
                outln!();
                serve(ledger, ServeArgs::for_demo(listen, http)).await?;
            }
            Ok(())
        }
        Command::Bench(args) => bench::run(ledger, args, json).await,
        Command::Target(_) | Command::Config(_) => Err(Failure {
            code: 1,
            message: "this command opens no ledger".into(),
        }),
        Command::Serve(args) => serve(ledger, args).await,
        Command::Token(command) => token(ledger.as_ref(), command, json).await,
        Command::Limits(command) => limits::run(ledger.as_ref(), command, json).await,
        Command::Prune(args) => prune::run(ledger.as_ref(), &args, json).await,
        Command::Archive(_) => Err(Failure {
            code: 1,
            message: "an archive is verified before any ledger is opened".into(),
        }),
    }
}

/// Prints `value` as JSON with `--json`, else the text `text` renders (which ends
/// its own lines).
fn emit<T: serde::Serialize>(json: bool, value: &T, text: impl FnOnce() -> String) {
    if json {
        render::print_json(value);
    } else {
        out!("{}", text());
    }
}

/// `leasehold migrate`.
async fn migrate<L: Ledger>(ledger: &L) -> Outcome {
    let applied = ledger.migrate().await?;
    if applied.is_empty() {
        match ledger.schema_notice().await? {
            Some(notice) => outln!("{notice}: applied nothing"),
            None => outln!("schema is up to date"),
        }
    } else {
        let list: Vec<String> = applied.iter().map(u32::to_string).collect();
        outln!("applied migrations: {}", list.join(", "));
    }
    Ok(())
}

/// `leasehold plan add|list|show|retire`.
async fn plan_command<L: Ledger>(ledger: &L, command: PlanCommand, json: bool) -> Outcome {
    match command {
        PlanCommand::Add { file } => {
            let spec = read_plan_file(&file)?;
            let plan = ledger
                .register_plan(spec, &Executors::new().names())
                .await
                .map_err(|e| match e {
                    LedgerError::InvalidPlan(p) => Failure::bad_input(format!("plan file {}: {p}", file.display())),
                    other => other.into(),
                })?;
            emit(json, &plan, || format!("{} {}\n", plan.id, plan.fingerprint));
        }
        PlanCommand::List => {
            let plans = ledger.list_plans().await?;
            emit(json, &plans, || render::plan_list(&plans));
        }
        PlanCommand::Show { plan } => {
            let plan = find_plan(ledger, &plan).await?;
            emit(json, &plan, || render::plan(&plan));
        }
        PlanCommand::Retire { plan } => {
            let plan = find_plan(ledger, &plan).await?;
            let plan = ledger.retire_plan(&plan.id).await?;
            emit(json, &plan, || format!("plan {} is {}\n", plan.id, plan.status));
        }
    }
    Ok(())
}

/// `leasehold worker`: delivers until stopped (or idle) and prints what it did.
async fn worker_command<L: Ledger>(
    ledger: Arc<L>,
    id: Option<String>,
    config: WorkerConfig,
    settings: WorkerSettings,
    http: &HttpArgs,
) -> Outcome {
    let id = id.unwrap_or_else(|| format!("worker-{}", std::process::id()));
    check_worker_id(&id)?;
    for queue in &settings.queues {
        check_name("--queue", queue)?;
    }
    let executors = Arc::new(http.executors(settings.step_timeout)?);
    match ledger.schema_notice().await {
        Ok(Some(notice)) => outln!("[{}] {notice}", leasehold::text::clean(&id)),
        // The ledger was reached a moment ago; the notice waits for the next start.
        Ok(None) | Err(LedgerError::Unavailable(_) | LedgerError::Ambiguous(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let report = run_worker(ledger, executors, &id, config, settings, stop_signal()).await;
    outln!(
        "[{}] done: claimed {}, delivered {}, failed {}, refused {}, abandoned {}, gave back {}",
        leasehold::text::clean(&id),
        report.claimed,
        report.delivered,
        report.failed,
        report.refused,
        report.abandoned,
        report.gave_back
    );
    Ok(())
}

/// `leasehold status ATTEMPT`: the record, and beside it (in text) the plan's
/// policy and what the attempt waits for when no live worker can run it.
async fn status<L: Ledger>(ledger: &L, attempt: String, json: bool) -> Outcome {
    let record = ledger.attempt(&AttemptId::new(attempt)).await?;
    if json {
        emit(json, &record, String::new);
        return Ok(());
    }
    // Shown when the plan and the fleet read; the record alone otherwise.
    let plan = ledger.plan(&record.attempt.plan_id).await.ok();
    let policy = plan.as_ref().map(|p| p.policy_of(&record));
    let waits_for = match (&plan, ledger.workers().await) {
        (Some(plan), Ok((fleet, at))) => leasehold::ledger::fleet::waits_for(&record, plan, &fleet, at),
        _ => None,
    };
    let now = leasehold::clock::Clock::now(&SystemClock);
    emit(json, &record, || {
        render::status(&record, policy.as_ref(), waits_for.as_deref(), now)
    });
    Ok(())
}

/// `leasehold reconcile ATTEMPT`.
async fn reconcile<L: Ledger>(ledger: &L, attempt: String, json: bool) -> Outcome {
    let (outcome, record) = ledger.reconcile(&AttemptId::new(attempt)).await?;
    let name = match outcome {
        ReconcileOutcome::Requeued => "requeued",
        ReconcileOutcome::Unchanged => "unchanged",
    };
    let value = serde_json::json!({ "outcome": name, "record": record });
    emit(json, &value, || match outcome {
        ReconcileOutcome::Requeued => format!(
            "requeued attempt {}: its expired lease was cleared\n",
            record.attempt.id
        ),
        ReconcileOutcome::Unchanged => format!(
            "left attempt {} unchanged: its command is {}\n",
            record.attempt.id, record.command.status
        ),
    });
    Ok(())
}

/// `leasehold compare PLAN [LEFT RIGHT]`: the two given attempts, or the plan's two
/// latest successful ones.
async fn compare_attempts<L: Ledger>(
    ledger: &L,
    plan: &str,
    left: Option<String>,
    right: Option<String>,
    json: bool,
) -> Outcome {
    let plan = find_plan(ledger, plan).await?;
    let (left, right) = match (left, right) {
        (Some(l), Some(r)) => (
            ledger.attempt(&AttemptId::new(l)).await?,
            ledger.attempt(&AttemptId::new(r)).await?,
        ),
        _ => {
            let history = ledger.history(&plan.id).await?;
            let (l, r) = latest_successful_pair(&plan, &history).ok_or_else(|| {
                Failure::bad_input(format!(
                    "plan {} has fewer than two successful attempts to compare",
                    plan.id
                ))
            })?;
            (l.clone(), r.clone())
        }
    };
    for record in [&left, &right] {
        if record.attempt.plan_id != plan.id {
            return Err(Failure::bad_input(format!(
                "attempt {} belongs to plan {}, not {}",
                record.attempt.id, record.attempt.plan_id, plan.id
            )));
        }
    }
    let comparison = compare(&plan, &left, &right);
    emit(json, &report::comparison_json(&comparison, &plan), || {
        report::comparison_text(&comparison, &plan)
    });
    Ok(())
}

/// `leasehold gate PLAN`: exit 0 on PASS, 4 on BLOCK.
async fn release_gate<L: Ledger>(ledger: &L, plan: &str, json: bool) -> Outcome {
    let plan = find_plan(ledger, plan).await?;
    let history = ledger.history(&plan.id).await?;
    let gate = gate(&plan, &history);
    emit(json, &report::gate_json(&gate, &plan), || {
        report::gate_text(&gate, &plan)
    });
    match report::gate_exit_code(&gate) {
        0 => Ok(()),
        code => Err(Failure::silent(u8::try_from(code).unwrap_or(1))),
    }
}

/// `leasehold target`: binds, opens the key store, prints where it listens (the
/// first line, for scripts), and serves until SIGINT/SIGTERM.
async fn serve_target(db: &str, args: &TargetArgs) -> Outcome {
    use leasehold::entropy::Entropy as _;
    let db = DbUrl::parse(db)?;
    let seed = args.seed.unwrap_or_else(|| OsEntropy.next_u64());
    let fail_for = args
        .fail_for
        .as_deref()
        .map(|d| when::parse_duration("--fail-for", d))
        .transpose()?;
    let faults = leasehold::receiver::Faults {
        fail_rate: args.fail_rate,
        fail_for,
        drop_reply_rate: args.drop_reply_rate,
        delay: Duration::from_millis(args.delay_ms),
        seed,
    }
    .checked()
    .map_err(Failure::bad_input)?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| Failure::bad_input(format!("--listen {}: cannot listen there: {e}", args.listen)))?;
    let addr = listener.local_addr().map_err(|e| Failure {
        code: 1,
        message: format!("--listen {}: {e}", args.listen),
    })?;
    let config = args.connections.config(args.grace_secs)?;
    let stop = stop_signal();
    let served = leasehold::receiver::open_and_serve_with(
        &db,
        faults,
        config,
        listener,
        |store| {
            outln!("leasehold target listening on http://{addr}");
            let window = faults
                .fail_for
                .map_or_else(String::new, |d| format!(" for the first {} ms", d.as_millis()));
            outln!(
                "keys in {store}; faults: fail-rate {}{window}, drop-reply-rate {}, delay {} ms, seed {seed}",
                faults.fail_rate,
                faults.drop_reply_rate,
                faults.delay.as_millis()
            );
        },
        stop,
    )
    .await
    .map_err(|e| Failure {
        code: match e {
            leasehold::receiver::StoreError::Invalid(_) => 2,
            _ => 1,
        },
        message: e.to_string(),
    })?;
    outln!(
        "stopped: {} connections served, {} refused at --max-connections, {} closed at the end of --grace-secs",
        served.accepted,
        served.refused,
        served.cut_at_grace
    );
    Ok(())
}

/// Refuses a `--id` no lease owner may have: blank, holding a character no name may
/// hold ([`leasehold_engine::names`]), or longer than a name may be.
fn check_worker_id(id: &str) -> Outcome {
    check_name("--id", id)
}

/// Refuses a name given as `flag` that is blank, holds a character no name may hold
/// ([`leasehold_engine::names`]) or is longer than a name may be.
fn check_name(flag: &str, name: &str) -> Outcome {
    if name.trim().is_empty() {
        return Err(Failure::bad_input(format!("{flag}: must not be empty")));
    }
    leasehold_engine::names::check(flag, name).map_err(|e| Failure::bad_input(e.to_string()))?;
    let (chars, max) = (name.chars().count(), leasehold_engine::plan::MAX_NAME_CHARS);
    if chars > max {
        return Err(Failure::bad_input(format!(
            "{flag}: {chars} characters exceeds the limit of {max}"
        )));
    }
    Ok(())
}

/// How a command-line worker runs, beyond its [`WorkerConfig`].
struct WorkerSettings {
    until_idle: bool,
    grace_ms: u64,
    step_timeout: Duration,
    /// `--queue`s (none: the default queue).
    queues: Vec<String>,
}

async fn run_worker<L: Ledger>(
    ledger: Arc<L>,
    executors: Arc<Executors>,
    id: &str,
    config: WorkerConfig,
    settings: WorkerSettings,
    stop: impl std::future::Future<Output = ()>,
) -> leasehold::worker::WorkerReport {
    let prefix = leasehold::text::clean(id).into_owned();
    let mut worker = Worker::new(id, ledger, executors, Arc::new(SystemClock), config);
    if !settings.queues.is_empty() {
        worker = worker.with_queues(settings.queues);
    }
    let worker = worker
        .with_step_timeout(settings.step_timeout)
        .on_event(move |event: &WorkerEvent| outln!("[{prefix}] {}", leasehold::text::clean(&event.to_string())));
    let options = RunOptions {
        until_idle: settings.until_idle,
        grace_ms: settings.grace_ms,
    };
    worker.run(stop, options).await
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called,
/// not when the future is first polled, so a signal that arrives while the worker is
/// starting is not lost (nor does it kill the process).
fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, Signal, SignalKind};
        async fn next(signal: &mut Option<Signal>) {
            match signal {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        let mut term = signal(SignalKind::terminate()).ok();
        let mut int = signal(SignalKind::interrupt()).ok();
        async move {
            tokio::select! {
                biased;
                () = next(&mut int) => {}
                () = next(&mut term) => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn read_plan_file(path: &Path) -> Result<PlanSpec, Failure> {
    let name = path.display();
    let text = read_capped(path, leasehold_engine::plan::MAX_PLAN_FILE_BYTES)
        .map_err(|e| Failure::bad_input(format!("plan file {name}: {e}")))?;
    parse_plan(&text, path.extension().and_then(|e| e.to_str()) == Some("json"))
        .map_err(|e| Failure::bad_input(format!("plan file {name}: {e}")))
}

/// Reads a UTF-8 text file of at most `max` bytes, reading no more than `max + 1`
/// bytes of it whatever it is (`/dev/zero`, a pipe, a huge file).
fn read_capped(path: &Path, max: u64) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > max {
        return Err(format!("larger than the limit of {max} bytes"));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())
}

/// `--key`: an enqueue key, or why not.
fn parse_enqueue_key(text: &str) -> Result<String, String> {
    leasehold_engine::transition::check_enqueue_key("--key", text).map(|()| text.to_owned())
}

/// `--order-key`: an order key, or why not.
fn parse_order_key(text: &str) -> Result<String, String> {
    leasehold_engine::transition::check_enqueue_key("--order-key", text).map(|()| text.to_owned())
}

/// `--input`: JSON, given inline or as `@FILE` (a file of at most
/// [`leasehold_engine::input::MAX_INPUT_BYTES`] and a little room for whitespace).
fn parse_input(text: &str) -> Result<serde_json::Value, String> {
    let text = match text.strip_prefix('@') {
        Some(path) => {
            let max = 2 * leasehold_engine::input::MAX_INPUT_BYTES as u64;
            read_capped(Path::new(path), max).map_err(|e| format!("{path}: {e}"))?
        }
        None => text.to_owned(),
    };
    serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))
}

/// `--traceparent`: a W3C trace context, or why not.
fn parse_traceparent(text: &str) -> Result<TraceContext, String> {
    TraceContext::parse(text.trim()).map_err(|e| e.reason.to_owned())
}

/// Parses plan text as JSON or TOML; the error is one line with its position.
fn parse_plan(text: &str, json: bool) -> Result<PlanSpec, String> {
    if json {
        return serde_json::from_str(text).map_err(|e| e.to_string());
    }
    toml::from_str(text).map_err(|e| toml_error(text, &e))
}

/// A TOML error of `text` as one line with its line number.
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!("line {line}: {message}")
        }
        None => message,
    }
}

async fn demo<L: Ledger>(ledger: Arc<L>, http: &HttpArgs) -> Outcome {
    let executors = Arc::new(http.executors(leasehold::worker::DEFAULT_STEP_TIMEOUT)?);
    let applied = ledger.migrate().await?;
    if !applied.is_empty() {
        outln!("migrated the database schema");
    }
    let spec = parse_plan(REHEARSAL_PLAN, false).map_err(|e| Failure {
        code: 1,
        message: format!("built-in rehearsal plan: {e}"),
    })?;
    let plan = ledger.register_plan(spec, &executors.names()).await?;
    outln!(
        "plan {} ({}, {} steps, recovery {})",
        plan.id,
        plan.name,
        plan.steps.len(),
        plan.recovery
    );
    outln!("fingerprint {}", plan.fingerprint);
    let config = WorkerConfig::clamped(true, 50, 5, 30_000);
    let mut attempts = Vec::new();
    for n in 1..=2 {
        let record = ledger.enqueue(&plan.id, Action::Execute).await?;
        outln!(
            "\nenqueued attempt {} (#{}) — running it with an in-process worker",
            record.attempt.id,
            record.attempt.number
        );
        let stop = std::future::pending::<()>();
        let settings = WorkerSettings {
            until_idle: true,
            grace_ms: 0,
            step_timeout: leasehold::worker::DEFAULT_STEP_TIMEOUT,
            queues: Vec::new(),
        };
        let report = run_worker(
            Arc::clone(&ledger),
            Arc::clone(&executors),
            &format!("demo-worker-{n}"),
            config,
            settings,
            stop,
        )
        .await;
        if report.delivered == 0 {
            return Err(Failure {
                code: 1,
                message: format!("attempt {} was not delivered", record.attempt.id),
            });
        }
        attempts.push(record.attempt.id);
    }
    outln!();
    let mut records = Vec::new();
    for id in &attempts {
        let record = ledger.attempt(id).await?;
        out!("{}", render::outcome(&plan, &record));
        records.push(record);
    }
    outln!();
    out!(
        "{}",
        report::comparison_text(&compare(&plan, &records[0], &records[1]), &plan)
    );
    outln!();
    let history = ledger.history(&plan.id).await?;
    out!("{}", report::gate_text(&gate(&plan, &history), &plan));
    Ok(())
}

/// Texts of the database URL never to log or answer: the URL as given, its
/// password, and its printable form.
fn register_db_secrets(db: &str) {
    let mut secrets = vec![db.to_owned()];
    secrets.extend(config::db_password(db));
    match DbUrl::parse(db) {
        Ok(DbUrl::Mysql(url)) => secrets.push(url.to_string()),
        Ok(DbUrl::Postgres(url)) => secrets.push(url.to_string()),
        _ => {}
    }
    leasehold::serve::logs::register_secrets(secrets);
}

async fn token<S: TokenStore>(store: &S, command: TokenCommand, json: bool) -> Outcome {
    let now = leasehold::clock::Clock::now(&SystemClock);
    match command {
        TokenCommand::Add { name, role } => {
            let (info, secret) = create_token(store, &name, role.into(), now).await?;
            if json {
                render::print_json(
                    &serde_json::json!({"name": info.name, "role": info.role, "token": secret.expose()}),
                );
            } else {
                outln!("{}", secret.expose());
                errln!(
                    "created {} token {:?}: the token above is shown only now (only its SHA-256 is stored)",
                    info.role,
                    info.name
                );
            }
            Ok(())
        }
        TokenCommand::List => {
            let tokens = store.list_tokens().await?;
            if json {
                render::print_json(&tokens);
            } else if tokens.is_empty() {
                outln!("no tokens");
            } else {
                for t in &tokens {
                    outln!(
                        "{:<24} {:<8} created {}  {}",
                        t.name,
                        t.role,
                        t.created_at,
                        t.revoked_at
                            .map_or_else(|| "active".to_owned(), |at| format!("revoked {at}"))
                    );
                }
            }
            Ok(())
        }
        TokenCommand::Revoke { name } => {
            let info = store.revoke_token(&name, now).await?;
            if json {
                render::print_json(&info);
            } else {
                outln!("revoked token {:?}", info.name);
            }
            Ok(())
        }
    }
}

/// Where a person opens the console for a server listening on `addr`.
fn console_base(addr: std::net::SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", std::net::SocketAddr::new(ip, addr.port()))
}

async fn bind(flag: &str, addr: &str) -> Result<tokio::net::TcpListener, Failure> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::bad_input(format!("{flag} {addr}: cannot listen: {e}")))
}

async fn serve<L: Ledger + TokenStore>(ledger: Arc<L>, args: ServeArgs) -> Outcome {
    let exporter = args.traces.exporter()?;
    let format = match args.log_format {
        LogFormatArg::Json => LogFormat::Json,
        LogFormatArg::Text => LogFormat::Text,
    };
    leasehold::serve::logs::init(Some(format), exporter.as_ref());
    let served = serve_until_stopped(ledger, args).await;
    exporter.inspect(leasehold::serve::otlp::Exporter::shutdown);
    served
}

/// `serve` once its logs (and spans) are set up.
async fn serve_until_stopped<L: Ledger + TokenStore>(ledger: Arc<L>, args: ServeArgs) -> Outcome {
    // Installed before anything is printed: a SIGTERM sent once the "serving" line
    // is out (or while starting) stops the server cleanly instead of killing it.
    let stop = stop_signal();
    let periodic = args.prune.checked()?;
    let applied = ledger.migrate().await?;
    if !applied.is_empty() {
        let list: Vec<String> = applied.iter().map(u32::to_string).collect();
        outln!("applied migrations: {}", list.join(", "));
    }
    let config = args.connections.config(args.grace_secs)?;
    let listener = bind("--listen", &args.listen).await?;
    let metrics = match &args.metrics_listen {
        Some(addr) => Some(bind("--metrics-listen", addr).await?),
        None => None,
    };
    let step_timeout = Duration::from_millis(bounds::ms(bounds::STEP_TIMEOUT_SECS, args.step_timeout_secs));
    let executors = Arc::new(args.http.executors(step_timeout)?);
    let app = leasehold::serve::App::new(Arc::clone(&ledger), &executors.names());
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::bad_input(format!("--listen {}: {e}", args.listen)))?;
    let base = console_base(addr);
    if !ledger.list_tokens().await?.iter().any(|t| t.is_active()) {
        let taken: Vec<String> = ledger.list_tokens().await?.into_iter().map(|t| t.name).collect();
        let name = (1..)
            .map(|n| {
                if n == 1 {
                    "admin".to_owned()
                } else {
                    format!("admin-{n}")
                }
            })
            .find(|n| !taken.contains(n))
            .unwrap_or_else(|| "admin".to_owned());
        let now = leasehold::clock::Clock::now(&SystemClock);
        let (info, secret) = create_token(ledger.as_ref(), &name, Role::Admin, now).await?;
        let path = app.login_path(secret.hash()).map_err(|p| Failure {
            code: 1,
            message: p.detail,
        })?;
        outln!(
            "no API token existed: created admin token {:?} (shown only now):",
            info.name
        );
        outln!("  {}", secret.expose());
        outln!("log in to the console once with this link (valid 15 minutes, one use):");
        outln!("  {base}{path}");
    }
    outln!(
        "serving the console at {base}/attempts, the API at {base}/api/v1 and metrics at {base}/metrics; {} in-process worker{}",
        args.workers,
        if args.workers == 1 { "" } else { "s" }
    );
    if let Some(m) = &metrics {
        if let Ok(a) = m.local_addr() {
            outln!("serving /metrics without authentication at http://{a}/metrics");
        }
    }
    let pool = leasehold::serve::WorkerPool {
        workers: args.workers,
        config: WorkerConfig::clamped(
            args.workers > 0,
            bounds::ms(bounds::POLL_SECS, args.poll_secs),
            args.batch,
            bounds::ms(bounds::LEASE_SECS, args.lease_secs),
        )
        .with_max_evidence_bytes(args.max_evidence_bytes),
        id: format!("serve-{}", std::process::id()),
        grace_ms: bounds::ms(bounds::GRACE_SECS, args.grace_secs),
        step_timeout,
    };
    let listeners = leasehold::serve::Listeners {
        api: listener,
        metrics,
        config,
    };
    let periodic = periodic.map(|p| p.spawn(Arc::clone(&ledger)));
    let report = leasehold::serve::run(app, ledger, executors, listeners, pool, stop).await;
    if let Some(periodic) = periodic {
        periodic.stop().await;
    }
    let report = report.map_err(|e| Failure {
        code: 1,
        message: format!("server: {e}"),
    })?;
    let w = report.workers;
    outln!(
        "stopped: workers claimed {}, delivered {}, failed {}, refused {}, abandoned {}; connections refused at --max-connections {}, closed at the end of --grace-secs {}",
        w.claimed, w.delivered, w.failed, w.refused, w.abandoned,
        report.api.refused + report.metrics.refused,
        report.api.cut_at_grace + report.metrics.cut_at_grace
    );
    Ok(())
}

#[cfg(test)]
mod props {
    //! Plan parsing and validation are total: any file content, any field text,
    //! parses and validates to a plan or to a one-line error, never a panic.

    use super::*;
    use leasehold_engine::{PlanId, Timestamp};
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![any::<String>(), "[ -~\n\u{1b}\u{202e}é]{0,40}", "[a-z-]{1,12}"]
    }

    fn payload() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            text().prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(text(), inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn plan_json() -> impl Strategy<Value = Value> {
        (
            text(),
            prop_oneof![Just("resume".to_owned()), Just("replay".to_owned()), text()],
            prop::collection::vec(text(), 0..3),
            prop::collection::vec(
                (
                    text(),
                    prop_oneof![Just("dry-run:v1".to_owned()), Just("sqlite-sandbox:v1".to_owned()), text()],
                    payload(),
                ),
                0..4,
            ),
        )
            .prop_map(|(name, recovery, volatile, steps)| {
                let steps: Vec<Value> = steps
                    .into_iter()
                    .map(|(code, executor, payload)| json!({"code": code, "executor": executor, "payload": {"p": payload}}))
                    .collect();
                json!({"name": name, "recovery": recovery, "volatile_fields": volatile, "steps": steps})
            })
    }

    fn validate(text: &str, is_json: bool) -> Result<(), String> {
        let spec = parse_plan(text, is_json)?;
        spec.into_plan(&Executors::new().names(), PlanId::new("p"), Timestamp::from_millis(0))
            .map(drop)
            .map_err(|e| e.to_string())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn any_text_parses_or_fails_on_one_line(text in any::<String>(), is_json in any::<bool>()) {
            if let Err(e) = validate(&text, is_json) {
                prop_assert!(!e.is_empty() && !e.contains('\n'), "{:?}", e);
            }
        }

        #[test]
        fn any_plan_shaped_file_validates_or_names_a_field(plan in plan_json()) {
            let as_json = plan.to_string();
            let json_result = validate(&as_json, true);
            if let Err(e) = &json_result {
                prop_assert!(!e.is_empty() && !e.contains('\n'), "{:?}", e);
            }
            if let Ok(as_toml) = toml::to_string(&plan) {
                let toml_result = validate(&as_toml, false);
                // The same plan in either spelling is accepted or refused alike.
                prop_assert_eq!(json_result.is_ok(), toml_result.is_ok(), "{:?} / {:?}", json_result, toml_result);
            }
        }
    }
}
