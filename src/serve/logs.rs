//! Structured logs (`tracing`): one event per worker transition and per operator
//! action, and a line per request (method, route path without its query, status,
//! duration), as JSON lines or text on stderr.
//!
//! Nothing logged carries a token: worker events never hold one, requests are
//! logged without headers or query strings, and every error text that reaches a
//! log goes through [`redacted`], which removes the database URL and password the
//! server was started with.

use super::otlp::{self, Exporter};
use std::sync::OnceLock;
use tracing_subscriber::filter::{filter_fn, LevelFilter};

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable text.
    #[default]
    Text,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "json" => Ok(Self::Json),
            "text" => Ok(Self::Text),
            other => Err(format!("--log-format: {other:?} is not json or text")),
        }
    }
}

static SECRETS: OnceLock<Vec<String>> = OnceLock::new();

/// Registers texts never to log or answer (the database URL, its password, their
/// printable forms). The first call wins.
pub fn register_secrets(secrets: impl IntoIterator<Item = String>) {
    let mut list: Vec<String> = secrets.into_iter().filter(|s| s.len() >= 4).collect();
    // Longest first, so that a URL is removed whole before its password inside it.
    list.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let _ = SECRETS.set(list);
}

/// `text` with every registered secret replaced by `<redacted>`.
pub fn redacted(text: &str) -> String {
    let mut out = text.to_owned();
    for secret in SECRETS.get().map(Vec::as_slice).unwrap_or_default() {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "<redacted>");
        }
    }
    out
}

/// Installs the global subscriber: log lines in `format` on stderr (none without
/// one), at `info` and above (the `LEASEHOLD_LOG` level, `debug` or `trace`, for
/// more), and the delivery spans ([`crate::trace`]) to `exporter` when there is one.
/// A second call does nothing.
pub fn init(format: Option<LogFormat>, exporter: Option<&Exporter>) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let level = match std::env::var("LEASEHOLD_LOG").as_deref() {
        Ok("trace") => LevelFilter::TRACE,
        Ok("debug") => LevelFilter::DEBUG,
        Ok("warn") => LevelFilter::WARN,
        Ok("error") => LevelFilter::ERROR,
        _ => LevelFilter::INFO,
    };
    // Log lines leave the spans out: they are the exporter's.
    let lines = format.map(|f| {
        lines(f)
            .with_filter(level)
            .with_filter(filter_fn(|m| !otlp::is_trace(m)))
    });
    let spans = exporter.map(|e| e.layer().with_filter(filter_fn(otlp::is_trace)));
    let _ = tracing_subscriber::registry().with(lines).with(spans).try_init();
}

type BoxedLayer = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

/// The log lines' layer.
fn lines(format: LogFormat) -> BoxedLayer {
    let builder = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // A line that cannot be written (stderr closed) is dropped, not reported on
        // that same stderr, which would panic.
        .log_internal_errors(false)
        .with_target(false);
    match format {
        LogFormat::Json => Box::new(builder.json().flatten_event(true)),
        LogFormat::Text => Box::new(builder.with_ansi(false)),
    }
}
