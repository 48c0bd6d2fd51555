//! `http:v1`: delivers a step as one HTTP request to an allowed host, with the
//! step's idempotency key, so that a receiver applies it once however often it is
//! sent.
//!
//! Contract. A step's payload:
//! - `url` (string, required): `http://` or `https://`, no credentials in it; its
//!   host and port must be on the worker's egress allowlist ([`HttpConfig`],
//!   `--http-allow HOST[:PORT]`; `HOST` alone is the scheme's default port, 80 or
//!   443), or the step fails permanently naming the flag;
//! - `method` (string): `POST` (default), `PUT`, `PATCH` or `DELETE`;
//! - `body` (JSON, optional): sent as canonical JSON (`Content-Type:
//!   application/json`), so every delivery sends the same bytes;
//! - `headers` (object of strings, optional): extra headers; `Authorization`,
//!   `Idempotency-Key`, `Host`, `Content-Length`, `webhook-*` and `Leasehold-*` are
//!   refused (the executor sets those);
//! - `auth_env` (string, optional): the name of an environment variable (it must
//!   start with `LEASEHOLD_SECRET_`) whose value is sent as the `Authorization`
//!   header value; the secret must be bound to the URL's host and port
//!   ([`SecretBinding`], `--http-secret NAME=HOST[:PORT]`), or the step fails
//!   permanently, before anything is sent, naming the secret, the host and the
//!   flag;
//! - `secret_env` (string, optional): likewise (and likewise bound), a Standard
//!   Webhooks secret (`whsec_<base64>`, or raw text): the request is signed with
//!   `webhook-id` (the idempotency key), `webhook-timestamp` and `webhook-signature:
//!   v1,<base64 HMAC-SHA256 of id.timestamp.body>`;
//! - `timeout_ms` (whole number, default 10000): one request's timeout, clamped to
//!   100..=60000;
//! - `budget_ms` (whole number, default 30000): the time all tries of this call may
//!   take, clamped to 100..=240000 and to [`HttpConfig::budget_cap`] (the CLI sets
//!   that just below the worker's step timeout, so the executor gives up —
//!   transient — before the worker stops the call — permanent);
//! - `evidence` (array of JSON pointers, optional): response body fields kept as
//!   evidence; the status always is;
//! - `expect` (array of statuses, default: any 2xx): the statuses that mean success;
//! - `receipt` (JSON pointer, default `/id`): the body field that is the receiver's
//!   id for this key, recorded in the target receipt.
//!
//! Every try sends `Idempotency-Key: <key>`, `Leasehold-Attempt`, `Leasehold-Step`,
//! `Leasehold-Delivery`, `Leasehold-Action` (execute, retry or compensate) and, when
//! the call has one, the W3C `traceparent` of its step span ([`crate::trace`]).
//!
//! Outcomes: an expected status → done, evidence `{"status", "fields": {pointer:
//! value}}`, target receipt `{"idempotency_key", "id"}`. 408, 409 (the key is still
//! being processed), 425, 429, 5xx, connection errors and timeouts → tried again with
//! the same key after a jittered exponential backoff (at least `Retry-After` seconds
//! when the receiver sends it) while the budget lasts, then transient (the worker
//! calls the step again within the plan's `step_max_tries`, then gives the command
//! back for a later delivery, with the same key); when the receiver's last answer
//! carried `Retry-After`, throttled: the command is given back at once, to be
//! delivered again no sooner than the receiver asked (within the plan's
//! `backoff_max_ms`). Any other
//! status (422: the key was used with another body; other 4xx; an unexpected 2xx or
//! 3xx) → permanent, with the status and at most 200 characters of the body.
//! Redirects are followed only to the same host and port (at most 5).
//!
//! Secrets: a secret bound to no host is sent nowhere. The values of every bound
//! secret are read once, on first use ([`Http::check_secrets`] reads them at
//! start); a value shorter than [`MIN_SECRET_BYTES`] is refused, naming the
//! variable. Every answer leaves the executor through one redaction: each bound
//! secret's value and its common encodings (`Bearer` form, credential, base64
//! standard and URL-safe with and without padding, hex, percent-encoding, JSON
//! escapes, a `whsec_` key's base64) are replaced with `[redacted NAME]` in every
//! string and object key of the evidence and target receipt and in every error, so
//! a receiver that echoes the request cannot put a value into stored evidence or
//! the worker's output; a body excerpt is redacted before it is cut. Only the
//! variable's name is ever named. The backoff's jitter is a function of the key and
//! the try number, not of a random source.

mod secrets;

pub use secrets::{is_secret_name, SecretBinding, MIN_SECRET_BYTES};

use super::{describe, ExecRequest, Executor, ExecutorResult};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use leasehold_engine::canonical::canonical_json;
use leasehold_engine::{Action, Step};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use secrets::{Redactor, Vault};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::time::Instant;

/// The executor name plans use for [`Http`].
pub const NAME: &str = "http:v1";

const PAYLOAD_FIELDS: &[&str] = &[
    "url",
    "method",
    "body",
    "headers",
    "auth_env",
    "secret_env",
    "timeout_ms",
    "budget_ms",
    "evidence",
    "expect",
    "receipt",
];

/// Environment variables a payload may name as a secret's source start with this.
pub const SECRET_ENV_PREFIX: &str = "LEASEHOLD_SECRET_";

/// How much of a response body is read (more is ignored).
const MAX_BODY_BYTES: usize = 64 * 1024;
/// How much of a body an error message quotes.
const EXCERPT_CHARS: usize = 200;
/// The first backoff, and the ceiling of any one backoff.
const BACKOFF_FIRST_MS: u64 = 100;
const BACKOFF_MAX_MS: u64 = 5_000;

/// One allowed egress destination: a host, and a port or any port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    host: String,
    port: Option<u16>,
}

impl AllowedHost {
    /// Parses `HOST[:PORT]` (`[v6]:PORT` for an IPv6 address); `HOST` alone allows
    /// the default port of the URL's scheme (80 for http, 443 for https).
    pub fn parse(text: &str) -> Result<Self, String> {
        Self::from_text(text).map_err(|why| format!("--http-allow {text:?}: {why} (expected HOST or HOST:PORT)"))
    }

    /// Parses `HOST[:PORT]`; the error is why not, for the caller to name its flag.
    fn from_text(text: &str) -> Result<Self, &'static str> {
        let text = text.trim();
        if text.is_empty() || text.contains(['/', '@', '?', '#', ' ', '=']) {
            return Err("not a host");
        }
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (host, after) = rest.split_once(']').ok_or("unclosed [")?;
            match after.strip_prefix(':') {
                Some(port) => (format!("[{host}]"), Some(port)),
                None if after.is_empty() => (format!("[{host}]"), None),
                None => return Err("junk after ]"),
            }
        } else {
            match text.rsplit_once(':') {
                Some((host, port)) if !host.contains(':') => (host.to_owned(), Some(port)),
                Some(_) => return Err("an IPv6 address goes in brackets"),
                None => (text.to_owned(), None),
            }
        };
        if host.is_empty() || host == "[]" {
            return Err("empty host");
        }
        let port = match port {
            Some(p) => Some(p.parse::<u16>().map_err(|_| "port is not a number 0..=65535")?),
            None => None,
        };
        Ok(Self {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// The targets ([`leasehold_engine::route`]) this entry allows: `http://` and
    /// `https://` to its host, at its port or at each scheme's default port.
    fn targets(&self) -> [String; 2] {
        let (http, https) = self.port.map_or((80, 443), |p| (p, p));
        [
            format!("http://{}:{http}", self.host),
            format!("https://{}:{https}", self.host),
        ]
    }

    /// Whether `url` goes to this host and port (without a port: the default port
    /// of the URL's scheme).
    fn allows(&self, url: &reqwest::Url) -> bool {
        let default = if url.scheme() == "https" { 443 } else { 80 };
        url.host_str().is_some_and(|h| h.eq_ignore_ascii_case(&self.host))
            && url.port_or_known_default() == Some(self.port.unwrap_or(default))
    }
}

impl fmt::Display for AllowedHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

/// The longest `budget_ms` a payload may ask for.
pub const MAX_BUDGET: Duration = Duration::from_secs(240);

/// The `http:v1` executor's configuration: its egress allowlist, the hosts each
/// secret may be sent to, and the cap on every call's budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Hosts the executor may call; empty: none.
    pub allow: Vec<AllowedHost>,
    /// The hosts each secret may be sent to (a secret may have several); a secret
    /// bound to none is sent nowhere.
    pub secrets: Vec<SecretBinding>,
    /// No call's tries last longer than this, whatever its `budget_ms` says: set it
    /// a little below the worker's step timeout, so that a call runs out of budget
    /// (transient: retried later with the same key) before the worker stops it
    /// (permanent). Default [`MAX_BUDGET`].
    pub budget_cap: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            secrets: Vec::new(),
            budget_cap: MAX_BUDGET,
        }
    }
}

impl HttpConfig {
    /// The targets its allowlist reaches (`scheme://host:port`,
    /// [`leasehold_engine::route::step_target`]).
    pub fn targets(&self) -> std::collections::BTreeSet<String> {
        self.allow.iter().flat_map(AllowedHost::targets).collect()
    }

    /// A configuration allowing each `HOST[:PORT]` given.
    pub fn allowing<S: AsRef<str>>(hosts: impl IntoIterator<Item = S>) -> Result<Self, String> {
        let allow = hosts
            .into_iter()
            .map(|h| AllowedHost::parse(h.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            allow,
            ..Self::default()
        })
    }

    /// The same configuration with each `LEASEHOLD_SECRET_NAME=HOST[:PORT]` given
    /// bound.
    pub fn binding<S: AsRef<str>>(mut self, bindings: impl IntoIterator<Item = S>) -> Result<Self, String> {
        for binding in bindings {
            self.secrets.push(SecretBinding::parse(binding.as_ref())?);
        }
        Ok(self)
    }
}

/// The `http:v1` executor.
pub struct Http {
    config: HttpConfig,
    /// Built on first use: most registries never send a request.
    client: OnceLock<Result<reqwest::Client, String>>,
    /// The bound secrets' values, read on first use.
    vault: OnceLock<Vault>,
}

impl fmt::Debug for Http {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Http")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Http {
    /// An executor calling only the hosts `config` allows.
    pub fn new(config: HttpConfig) -> Self {
        Self {
            config,
            client: OnceLock::new(),
            vault: OnceLock::new(),
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &HttpConfig {
        &self.config
    }

    /// Reads every bound secret now (otherwise that happens on first use): the
    /// first one that is unset, not UTF-8 or too short, named with why; never a
    /// value.
    pub fn check_secrets(&self) -> Result<(), String> {
        match self.vault().first_error() {
            Some(why) => Err(format!("--http-secret: {why}")),
            None => Ok(()),
        }
    }

    fn vault(&self) -> &Vault {
        self.vault.get_or_init(|| Vault::load(&self.config.secrets))
    }

    fn client(&self) -> Result<&reqwest::Client, String> {
        self.client
            .get_or_init(|| {
                reqwest::Client::builder()
                    .redirect(reqwest::redirect::Policy::custom(|attempt| {
                        let first = &attempt.previous()[0];
                        let next = attempt.url();
                        if attempt.previous().len() > 5 {
                            attempt.error("more than 5 redirects")
                        } else if next.host_str() != first.host_str()
                            || next.port_or_known_default() != first.port_or_known_default()
                        {
                            attempt.error("redirect to another host refused")
                        } else {
                            attempt.follow()
                        }
                    }))
                    .build()
                    .map_err(|e| format!("cannot build the HTTP client: {e}"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

impl Executor for Http {
    /// Every answer leaves through here, with every form of every bound secret
    /// redacted from its evidence, target receipt or error.
    async fn execute(&self, request: ExecRequest) -> ExecutorResult {
        let vault = self.vault();
        let result = self.deliver(&request, vault).await;
        vault.redactor().result(result)
    }
}

impl Http {
    async fn deliver(&self, request: &ExecRequest, vault: &Vault) -> ExecutorResult {
        let call = match Call::parse(request, &self.config, vault) {
            Ok(call) => call,
            Err(message) => return ExecutorResult::Permanent(message),
        };
        let client = match self.client() {
            Ok(client) => client,
            Err(message) => return ExecutorResult::Transient(message),
        };
        call.run(client, request, vault.redactor()).await
    }
}

/// A validated step payload, ready to send.
struct Call {
    code: String,
    url: reqwest::Url,
    method: reqwest::Method,
    body: Option<Vec<u8>>,
    headers: HeaderMap,
    signing_key: Option<Vec<u8>>,
    timeout: Duration,
    budget: Duration,
    evidence: Vec<String>,
    expect: Option<Vec<u16>>,
    receipt: String,
}

/// Why one try did not succeed.
enum TryError {
    /// Worth trying again with the same key (after `retry_after`, if the receiver
    /// said).
    Transient {
        message: String,
        retry_after: Option<Duration>,
    },
    /// Never going to succeed.
    Permanent(String),
}

impl Call {
    /// Validates a step's payload against this worker's configuration: every error
    /// names the step and the field.
    fn parse(request: &ExecRequest, config: &HttpConfig, vault: &Vault) -> Result<Self, String> {
        let step: &Step = &request.step;
        let code = step.code.clone();
        let p = Payload::of(&code, &step.payload)?;
        let url = p.url(config)?;
        let method = p.method()?;
        let body = p.fields.get("body").map(|b| canonical_json(b).into_bytes());
        let mut headers = p.headers()?;
        if body.is_some() {
            headers.insert(
                reqwest::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        let secret = |field: &str| bound_secret(&code, p.fields, field, &url, config, vault);
        if let Some(secret) = secret("auth_env")? {
            let mut value = HeaderValue::from_bytes(&secret).map_err(|_| {
                p.err(
                    "auth_env",
                    "names a variable whose value is not a valid header value".into(),
                )
            })?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let signing_key = match secret("secret_env")? {
            None => None,
            Some(secret) => Some(p.signing_key(secret)?),
        };
        let timeout = Duration::from_millis(
            whole(&code, p.fields, "timeout_ms")?
                .unwrap_or(10_000)
                .clamp(100, 60_000),
        );
        let budget = Duration::from_millis(
            whole(&code, p.fields, "budget_ms")?
                .unwrap_or(30_000)
                .clamp(100, 240_000),
        )
        .min(config.budget_cap);
        let (evidence, expect, receipt) = (p.evidence()?, p.expect()?, p.receipt()?);
        fixed_headers(&mut headers, request);
        Ok(Self {
            code,
            url,
            method,
            body,
            headers,
            signing_key,
            timeout,
            budget,
            evidence,
            expect,
            receipt,
        })
    }

    /// Tries the request until it succeeds, fails permanently, or the budget ends.
    async fn run(&self, client: &reqwest::Client, request: &ExecRequest, redactor: &Redactor) -> ExecutorResult {
        let deadline = Instant::now() + self.budget;
        let mut tries = 0u32;
        loop {
            tries += 1;
            let left = deadline.saturating_duration_since(Instant::now());
            let error = match self.try_once(client, request, left.min(self.timeout), redactor).await {
                Ok(done) => return done,
                Err(TryError::Permanent(message)) => return ExecutorResult::Permanent(message),
                Err(TryError::Transient { message, retry_after }) => (message, retry_after),
            };
            let (message, retry_after) = error;
            let wait = backoff(&request.idempotency_key, tries).max(retry_after.unwrap_or_default());
            if Instant::now() + wait >= deadline {
                let error = format!(
                    "step {}: {message} (gave up after {tries} tries within the {} ms budget; the key is kept)",
                    self.code,
                    self.budget.as_millis()
                );
                return match retry_after {
                    // The receiver said when: the worker gives the command back until then.
                    Some(after) => ExecutorResult::Throttled {
                        error,
                        retry_after_ms: after.as_millis().try_into().unwrap_or(u64::MAX),
                    },
                    None => ExecutorResult::Transient(error),
                };
            }
            tokio::time::sleep(wait).await;
        }
    }

    async fn try_once(
        &self,
        client: &reqwest::Client,
        request: &ExecRequest,
        timeout: Duration,
        redactor: &Redactor,
    ) -> Result<ExecutorResult, TryError> {
        let code = &self.code;
        let mut builder = client
            .request(self.method.clone(), self.url.clone())
            .headers(self.headers.clone())
            .timeout(timeout);
        if let Some(key) = &self.signing_key {
            let timestamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default();
            let body = self.body.as_deref().unwrap_or_default();
            let signature = sign(key, &request.idempotency_key, timestamp, body);
            builder = builder
                .header("webhook-id", request.idempotency_key.as_str())
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", format!("v1,{signature}"));
        }
        if let Some(body) = &self.body {
            builder = builder.body(body.clone());
        }
        let mut response = builder.send().await.map_err(|e| classify(code, &e))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|secs| Duration::from_secs(secs.min(3_600)));
        let mut body = Vec::new();
        while body.len() < MAX_BODY_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(e) => return Err(classify(code, &e)),
            }
        }
        body.truncate(MAX_BODY_BYTES);
        let expected = match &self.expect {
            Some(list) => list.contains(&status),
            None => (200..300).contains(&status),
        };
        if expected {
            let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let fields: Map<String, Value> = self
                .evidence
                .iter()
                .map(|p| (p.clone(), parsed.pointer(p).cloned().unwrap_or(Value::Null)))
                .collect();
            return Ok(ExecutorResult::Done {
                evidence: json!({"status": status, "fields": fields}),
                target_receipt: json!({
                    "idempotency_key": request.idempotency_key,
                    "id": parsed.pointer(&self.receipt).cloned().unwrap_or(Value::Null),
                }),
            });
        }
        // Redacted before it is cut, so that no part of a secret survives the cut.
        let body = String::from_utf8_lossy(&body);
        let excerpt: String = redactor.text(&body).chars().take(EXCERPT_CHARS).collect();
        let what = format!(
            "{} answered {status}: {excerpt:?}",
            self.url.host_str().unwrap_or("the host")
        );
        if matches!(status, 408 | 409 | 425 | 429) || (500..600).contains(&status) {
            Err(TryError::Transient {
                message: what,
                retry_after,
            })
        } else if status == 422 {
            Err(TryError::Permanent(format!(
                "step {code}: {what} (the receiver refused the idempotency key, used before with another body)"
            )))
        } else {
            Err(TryError::Permanent(format!("step {code}: {what}")))
        }
    }
}

/// A step's payload being read: each reader validates one field and names it in
/// its error.
struct Payload<'a> {
    code: &'a str,
    fields: &'a Map<String, Value>,
}

impl<'a> Payload<'a> {
    /// The payload's fields, if it is an object holding only known fields.
    fn of(code: &'a str, payload: &'a Value) -> Result<Self, String> {
        let Some(fields) = payload.as_object() else {
            return Err(format!(
                "step {code}: {NAME} payload must be an object, not {}",
                describe(payload)
            ));
        };
        if let Some(unknown) = fields.keys().find(|k| !PAYLOAD_FIELDS.contains(&k.as_str())) {
            return Err(format!(
                "step {code}: payload field {unknown:?} is not known to {NAME} (expected one of: {})",
                PAYLOAD_FIELDS.join(", ")
            ));
        }
        Ok(Self { code, fields })
    }

    fn err(&self, field: &str, why: String) -> String {
        format!("step {}: payload field {field} {why}", self.code)
    }

    /// `url`: http or https, no credentials, a host and port on the allowlist.
    fn url(&self, config: &HttpConfig) -> Result<reqwest::Url, String> {
        let url_text = match self.fields.get("url") {
            Some(Value::String(s)) => s.as_str(),
            Some(other) => return Err(self.err("url", format!("must be a string, not {}", describe(other)))),
            None => return Err(self.err("url", "is missing".into())),
        };
        let url = reqwest::Url::parse(url_text).map_err(|e| self.err("url", format!("is not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(self.err("url", format!("must be http or https, not {}", url.scheme())));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(self.err("url", "must not carry credentials (use auth_env)".into()));
        }
        if !config.allow.iter().any(|a| a.allows(&url)) {
            let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
            let port = url.port_or_known_default().unwrap_or(0);
            let allowed: Vec<String> = config.allow.iter().map(ToString::to_string).collect();
            return Err(format!(
                "step {}: host {host}:{port} is not on this worker's egress allowlist \
                 (allow it with --http-allow {host}:{port}; allowed now: {})",
                self.code,
                if allowed.is_empty() {
                    "none".to_owned()
                } else {
                    allowed.join(", ")
                }
            ));
        }
        Ok(url)
    }

    /// `method`: POST (the default), PUT, PATCH or DELETE.
    fn method(&self) -> Result<reqwest::Method, String> {
        match self.fields.get("method") {
            None => Ok(reqwest::Method::POST),
            Some(Value::String(m)) => match m.to_ascii_uppercase().as_str() {
                "POST" => Ok(reqwest::Method::POST),
                "PUT" => Ok(reqwest::Method::PUT),
                "PATCH" => Ok(reqwest::Method::PATCH),
                "DELETE" => Ok(reqwest::Method::DELETE),
                _ => Err(self.err("method", format!("must be POST, PUT, PATCH or DELETE, not {m:?}"))),
            },
            Some(other) => Err(self.err("method", format!("must be a string, not {}", describe(other)))),
        }
    }

    /// `headers`: an object of strings, none of the headers the executor sets itself.
    fn headers(&self) -> Result<HeaderMap, String> {
        let mut headers = HeaderMap::new();
        let extra = match self.fields.get("headers") {
            None => return Ok(headers),
            Some(Value::Object(extra)) => extra,
            Some(other) => {
                return Err(self.err(
                    "headers",
                    format!("must be an object of strings, not {}", describe(other)),
                ))
            }
        };
        for (name, value) in extra {
            if is_reserved_header(name) {
                return Err(self.err(
                    "headers",
                    format!("must not set {name} (the executor sets it; secrets come from auth_env)"),
                ));
            }
            let Value::String(value) = value else {
                return Err(self.err(
                    "headers",
                    format!("value of {name} must be a string, not {}", describe(value)),
                ));
            };
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| self.err("headers", format!("has an invalid header name {name:?}")))?;
            let value = HeaderValue::from_str(value)
                .map_err(|_| self.err("headers", format!("value of {name} is not a valid header value")))?;
            headers.insert(name, value);
        }
        Ok(headers)
    }

    /// The signing key of `secret_env`'s secret: a `whsec_` secret's base64 key, or
    /// the bytes as they are.
    fn signing_key(&self, secret: Vec<u8>) -> Result<Vec<u8>, String> {
        match secret.strip_prefix(b"whsec_") {
            Some(encoded) => base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|_| self.err("secret_env", "names a whsec_ secret that is not base64".into())),
            None => Ok(secret),
        }
    }

    /// `evidence`: the JSON pointers into the reply kept as evidence.
    fn evidence(&self) -> Result<Vec<String>, String> {
        match self.fields.get("evidence") {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(p) if p.is_empty() || p.starts_with('/') => Ok(p.clone()),
                    other => Err(self.err(
                        "evidence",
                        format!("must hold JSON pointers (\"/a/b\"), not {}", describe(other)),
                    )),
                })
                .collect(),
            Some(other) => Err(self.err(
                "evidence",
                format!("must be an array of JSON pointers, not {}", describe(other)),
            )),
        }
    }

    /// `expect`: the statuses that count as success, if not every 2xx.
    fn expect(&self) -> Result<Option<Vec<u16>>, String> {
        match self.fields.get("expect") {
            None => Ok(None),
            Some(Value::Array(items)) if !items.is_empty() => items
                .iter()
                .map(|item| {
                    item.as_u64()
                        .filter(|s| (100..=599).contains(s))
                        .map(|s| s as u16)
                        .ok_or_else(|| {
                            self.err(
                                "expect",
                                format!("must hold statuses 100..=599, not {}", describe(item)),
                            )
                        })
                })
                .collect::<Result<_, _>>()
                .map(Some),
            Some(other) => Err(self.err(
                "expect",
                format!("must be a non-empty array of statuses, not {}", describe(other)),
            )),
        }
    }

    /// `receipt`: the JSON pointer to the receiver's id (default `/id`).
    fn receipt(&self) -> Result<String, String> {
        match self.fields.get("receipt") {
            None => Ok("/id".to_owned()),
            Some(Value::String(p)) if p.is_empty() || p.starts_with('/') => Ok(p.clone()),
            Some(other) => Err(self.err(
                "receipt",
                format!("must be a JSON pointer (\"/id\"), not {}", describe(other)),
            )),
        }
    }
}

/// Headers a payload may not set: the executor sets them (or they carry secrets).
fn is_reserved_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    [
        "authorization",
        "idempotency-key",
        "host",
        "content-length",
        "transfer-encoding",
        "traceparent",
    ]
    .contains(&lower.as_str())
        || lower.starts_with("webhook-")
        || lower.starts_with("leasehold-")
}

/// The headers every request carries: the idempotency key and the delivery's
/// identity.
fn fixed_headers(headers: &mut HeaderMap, request: &ExecRequest) {
    let action = match request.action {
        Action::Execute => "execute",
        Action::Retry => "retry",
        Action::Compensate => "compensate",
    };
    let fixed = [
        ("idempotency-key", request.idempotency_key.clone()),
        ("leasehold-attempt", request.attempt_id.to_string()),
        ("leasehold-step", request.step.code.clone()),
        ("leasehold-delivery", request.delivery.to_string()),
        ("leasehold-action", action.to_owned()),
    ];
    for (name, value) in fixed {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    if let Some(trace) = &request.traceparent {
        if let Ok(value) = HeaderValue::from_str(trace.as_str()) {
            headers.insert("traceparent", value);
        }
    }
}

/// A transport error's class: a refused redirect or a malformed request is
/// permanent; connection errors and timeouts are transient.
fn classify(code: &str, error: &reqwest::Error) -> TryError {
    // Without the URL: it is the plan's, and the message stays short.
    let error_text = error.without_url_ref();
    if error.is_redirect() || error.is_builder() {
        TryError::Permanent(format!("step {code}: {error_text}"))
    } else {
        TryError::Transient {
            message: if error.is_timeout() {
                "request timed out".to_owned()
            } else if error.is_connect() {
                format!("cannot connect: {error_text}")
            } else {
                format!("request failed: {error_text}")
            },
            retry_after: None,
        }
    }
}

/// Strips the URL from a reqwest error's text.
trait WithoutUrl {
    fn without_url_ref(&self) -> String;
}

impl WithoutUrl for reqwest::Error {
    fn without_url_ref(&self) -> String {
        let mut text = self.to_string();
        if let Some(url) = self.url() {
            text = text.replace(&format!(" ({url})"), "").replace(url.as_str(), "the URL");
        }
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        text
    }
}

/// The backoff before try `tries + 1`: exponential from 100 ms, capped at 5 s, with
/// a jitter (50 to 100 %) derived from the key and the try number.
fn backoff(key: &str, tries: u32) -> Duration {
    let ceiling = BACKOFF_FIRST_MS
        .saturating_mul(1u64 << tries.saturating_sub(1).min(16))
        .min(BACKOFF_MAX_MS);
    let digest = Sha256::digest(format!("{key}#{tries}").as_bytes());
    let fraction = u64::from(u16::from_be_bytes([digest[0], digest[1]]));
    Duration::from_millis(ceiling / 2 + ceiling / 2 * fraction / u64::from(u16::MAX))
}

/// The Standard Webhooks signature: base64 HMAC-SHA256 of `id.timestamp.body`.
pub fn sign(key: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// The value of the secret payload field `field` names, if the secret is bound to
/// `url`'s host and port; the error names the field and the variable (and the host,
/// and how to bind it), never a value.
fn bound_secret(
    code: &str,
    fields: &Map<String, Value>,
    field: &str,
    url: &reqwest::Url,
    config: &HttpConfig,
    vault: &Vault,
) -> Result<Option<Vec<u8>>, String> {
    let name = match fields.get(field) {
        None => return Ok(None),
        Some(Value::String(name)) => name,
        Some(other) => {
            return Err(format!(
                "step {code}: payload field {field} must name an environment variable, not {}",
                describe(other)
            ))
        }
    };
    if !is_secret_name(name) {
        return Err(format!(
            "step {code}: payload field {field} must name a variable {SECRET_ENV_PREFIX}[A-Z0-9_]*, not {name:?}"
        ));
    }
    let bound: Vec<&SecretBinding> = config.secrets.iter().filter(|b| b.name() == name).collect();
    if !bound.iter().any(|b| b.host().allows(url)) {
        let host = url.host_str().unwrap_or_default();
        let port = url.port_or_known_default().unwrap_or(0);
        let hosts: Vec<String> = bound.iter().map(|b| b.host().to_string()).collect();
        return Err(format!(
            "step {code}: payload field {field}: secret {name} may not be sent to {host}:{port} (bound to: {}; bind \
             it with --http-secret {name}={host}:{port})",
            if hosts.is_empty() {
                "no host".to_owned()
            } else {
                hosts.join(", ")
            }
        ));
    }
    match vault.get(name) {
        Some(Ok(value)) => Ok(Some(value.clone())),
        Some(Err(why)) => Err(format!("step {code}: payload field {field}: {why}")),
        None => Err(format!(
            "step {code}: payload field {field}: secret {name} is not bound"
        )),
    }
}

/// Reads an optional whole-number payload field.
fn whole(code: &str, fields: &Map<String, Value>, field: &str) -> Result<Option<u64>, String> {
    match fields.get(field) {
        None => Ok(None),
        Some(value) => value
            .as_u64()
            .or_else(|| {
                value
                    .as_f64()
                    .filter(|f| *f >= 0.0 && f.fract() == 0.0)
                    .map(|f| f as u64)
            })
            .map(Some)
            .ok_or_else(|| {
                format!(
                    "step {code}: payload field {field} must be a non-negative whole number of milliseconds, not {}",
                    describe(value)
                )
            }),
    }
}

#[cfg(test)]
mod tests;
