//! The receiver's HTTP side: the contract's decisions (see the module above), the
//! fault draws, and how a reply is dropped.
//!
//! Routes: `GET /effects` answers [`Effects`] as JSON; every other request (any
//! method, any path) is a delivery, keyed by its `Idempotency-Key`. Deliveries are
//! counted in flight ([`Concurrency`]) from the start of their handler until their
//! answer is ready; `GET /effects` is not.

use super::concurrency::Concurrency;
use super::{
    Begun, Counted, Effects, FaultCounts, KeyStore, StoreError, StoredResponse, MAX_KEY_CHARS, PROCESSING_HOLD,
};
use crate::entropy::{Entropy, OsEntropy, SeededEntropy};
use crate::listener;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// The faults a target injects, and the seed of their draws.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// The share of deliveries answered 503 before anything is done (0 to 1).
    pub fail_rate: f64,
    /// If set, `fail_rate` applies only this long after the target starts; then it
    /// is healthy (a receiver that is down for a while and comes back).
    pub fail_for: Option<Duration>,
    /// The share of first applications whose connection is closed, after the effect
    /// is committed, without a reply (0 to 1).
    pub drop_reply_rate: f64,
    /// How long the work of a first request takes (while it holds its key), and how
    /// much later a replay is answered.
    pub delay: Duration,
    /// Seeds the draws: the same seed draws the same sequence of faults, request
    /// after request, in arrival order.
    pub seed: u64,
}

/// The longest delay a target accepts.
pub const MAX_DELAY: Duration = Duration::from_secs(60);

/// The most keys whose injected failures are counted one by one
/// ([`FaultCounts::failed_by_key`]); failures of further keys count in the total only.
pub const MAX_FAILED_KEYS: usize = 65_536;

impl Faults {
    /// No faults and no delay.
    pub fn none() -> Self {
        Self {
            fail_rate: 0.0,
            fail_for: None,
            drop_reply_rate: 0.0,
            delay: Duration::ZERO,
            seed: 0,
        }
    }

    /// These faults, or an error naming the flag whose value is not a rate between 0
    /// and 1; the delay is clamped to [`MAX_DELAY`].
    pub fn checked(self) -> Result<Self, String> {
        for (flag, rate) in [
            ("--fail-rate", self.fail_rate),
            ("--drop-reply-rate", self.drop_reply_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("{flag} {rate}: must be a rate between 0 and 1"));
            }
        }
        Ok(Self {
            delay: self.delay.min(MAX_DELAY),
            ..self
        })
    }
}

/// The reference receiver over a [`KeyStore`].
pub struct Target<S> {
    store: S,
    faults: Faults,
    draws: SeededEntropy,
    /// When the target was made: `fail_for` counts from here.
    started: Instant,
    failed: AtomicU64,
    failed_by_key: Mutex<BTreeMap<String, u64>>,
    dropped_replies: AtomicU64,
    concurrency: Concurrency,
}

impl<S> std::fmt::Debug for Target<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

/// What a delivery is answered, once the store has decided.
enum Answer {
    /// The first request with its key: applied now.
    Applied(StoredResponse),
    /// A repeat with the same body: the stored response.
    Replayed(StoredResponse),
    /// A repeat while the key is held by another request (409).
    InProgress,
    /// A repeat with another body (422).
    Mismatch,
}

impl<S: KeyStore> Target<S> {
    /// A receiver storing its keys in `store` and injecting `faults` (rates outside
    /// 0..=1 are clamped; use [`Faults::checked`] to refuse them instead).
    pub fn new(store: S, faults: Faults) -> Self {
        let rate = |r: f64| if r.is_nan() { 0.0 } else { r.clamp(0.0, 1.0) };
        Self {
            store,
            draws: SeededEntropy::new(faults.seed),
            faults: Faults {
                fail_rate: rate(faults.fail_rate),
                fail_for: faults.fail_for,
                drop_reply_rate: rate(faults.drop_reply_rate),
                delay: faults.delay.min(MAX_DELAY),
                seed: faults.seed,
            },
            started: Instant::now(),
            failed: AtomicU64::new(0),
            failed_by_key: Mutex::new(BTreeMap::new()),
            dropped_replies: AtomicU64::new(0),
            concurrency: Concurrency::default(),
        }
    }

    /// Serves the receiver on `listener` until `shutdown` resolves, with the default
    /// [`listener::Config`]; see [`Target::serve_with`].
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        self.serve_with(listener, listener::Config::default(), shutdown)
            .await
            .map(|_| ())
    }

    /// Serves the receiver on `listener` until `shutdown` resolves (then lets the
    /// requests in flight finish within `config.grace`), with `config`'s timeouts,
    /// connection cap and allowed hosts ([`crate::listener`]). The request timeout
    /// counts from the end of the faults' delay, so a delayed request is not cut.
    /// Answers what the listener counted.
    pub async fn serve_with(
        self,
        listener: TcpListener,
        config: listener::Config,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<listener::Served> {
        let config = listener::Config {
            request_timeout: config.request_timeout + self.faults.delay,
            ..config
        };
        let app = Router::new()
            .route("/effects", get(effects::<S>))
            .fallback(deliver::<S>)
            .with_state(Arc::new(self));
        let wrap = |stream, _peer| {
            let reply_drop = ReplyDrop::default();
            let stream = DroppableStream {
                stream,
                reply_drop: reply_drop.clone(),
            };
            (stream, reply_drop)
        };
        Ok(listener::serve_wrapped(listener, app, config, wrap, shutdown).await)
    }

    /// Draws this request's faults: (fail before doing anything, drop the reply).
    /// Both are drawn for every delivery, so that the sequence follows the seed; a
    /// failure drawn after `fail_for` has run out is not injected.
    fn draw(&self) -> (bool, bool) {
        let chance = |rate: f64| {
            let unit = (self.draws.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            unit < rate
        };
        let fail = chance(self.faults.fail_rate);
        let failing = self.faults.fail_for.is_none_or(|d| self.started.elapsed() < d);
        (fail && failing, chance(self.faults.drop_reply_rate))
    }

    /// Counts an injected failure of a request with `key`.
    fn count_failure(&self, key: &str) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut by_key = self.failed_by_key.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = by_key.get_mut(key) {
            *n += 1;
        } else if by_key.len() < MAX_FAILED_KEYS {
            by_key.insert(key.to_owned(), 1);
        }
    }

    /// Steps 3 to 6 of the contract for one delivery to `path`.
    async fn handle(&self, key: String, fingerprint: String, path: &str) -> Result<Answer, StoreError> {
        let hold_ms = (PROCESSING_HOLD + self.faults.delay).as_millis() as u64;
        match self.store.begin(&key, &fingerprint, now_ms(), hold_ms).await? {
            Begun::Claimed(claim) => {
                // The receiver's work. While it runs the key is held: a repeat now
                // gets 409.
                tokio::time::sleep(self.faults.delay).await;
                let receipt_id = format!("rcpt-{:016x}", OsEntropy.next_u64());
                let response = StoredResponse {
                    status: StatusCode::CREATED.as_u16(),
                    body: json!({"id": receipt_id, "idempotency_key": key, "status": "applied"}).to_string(),
                };
                if self.store.apply(&claim, &receipt_id, path, &response, now_ms()).await? {
                    Ok(Answer::Applied(response))
                } else {
                    // Held past its hold and taken over by a repeat, which applies it.
                    self.store.count(Counted::Conflict).await?;
                    Ok(Answer::InProgress)
                }
            }
            Begun::Done { body_sha256, response } if body_sha256 == fingerprint => {
                self.store.count(Counted::Replay).await?;
                tokio::time::sleep(self.faults.delay).await;
                Ok(Answer::Replayed(response))
            }
            Begun::Processing { body_sha256 } if body_sha256 == fingerprint => {
                self.store.count(Counted::Conflict).await?;
                Ok(Answer::InProgress)
            }
            Begun::Done { .. } | Begun::Processing { .. } => {
                self.store.count(Counted::Mismatch).await?;
                Ok(Answer::Mismatch)
            }
        }
    }
}

/// `GET /effects`.
async fn effects<S: KeyStore>(State(target): State<Arc<Target<S>>>) -> Response {
    match target.store.effects().await {
        Ok(effects) => Json(Effects {
            faults: FaultCounts {
                failed: target.failed.load(Ordering::Relaxed),
                failed_by_key: target.failed_by_key.lock().unwrap_or_else(|e| e.into_inner()).clone(),
                dropped_replies: target.dropped_replies.load(Ordering::Relaxed),
            },
            max_concurrent: target.concurrency.max(),
            max_concurrent_by_path: target.concurrency.max_by_path(),
            ..effects
        })
        .into_response(),
        Err(e) => problem(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// Every other request: a delivery.
async fn deliver<S: KeyStore>(
    State(target): State<Arc<Target<S>>>,
    ConnectInfo(reply_drop): ConnectInfo<ReplyDrop>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let in_flight = target.concurrency.enter(&path);
    let key = match idempotency_key(&headers) {
        Ok(key) => key,
        Err(why) => return problem(StatusCode::BAD_REQUEST, why),
    };
    let (fail, drop_reply) = target.draw();
    if fail {
        target.count_failure(&key);
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "injected failure (--fail-rate): nothing was done; retry with the same key",
        );
    }
    let fingerprint = hex::encode(Sha256::digest(&body));
    // In a task of its own: once the key is claimed, the work runs to its end even
    // if the client hangs up, so no key is left half-done by a vanished sender. The
    // task holds the delivery in flight while it runs and hands it back with its
    // answer, so it leaves once the answer is ready (or the work ends unanswered).
    let work = tokio::spawn({
        let target = Arc::clone(&target);
        async move { (target.handle(key, fingerprint, &path).await, in_flight) }
    });
    let (done, _in_flight) = match work.await {
        Ok(done) => done,
        Err(e) => {
            return problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("the request's task failed: {e}"),
            )
        }
    };
    let answer = match done {
        Ok(answer) => answer,
        Err(e) => return problem(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    match answer {
        Answer::Applied(stored) => {
            if drop_reply {
                target.dropped_replies.fetch_add(1, Ordering::Relaxed);
                reply_drop.arm();
            }
            stored_reply(&stored, false)
        }
        Answer::Replayed(stored) => stored_reply(&stored, true),
        Answer::InProgress => {
            let mut response = problem(
                StatusCode::CONFLICT,
                "a request with this Idempotency-Key is still being processed; retry later",
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
        Answer::Mismatch => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this Idempotency-Key was used with another request body",
        ),
    }
}

/// The key of a delivery: one `Idempotency-Key` header, bare or as a quoted string,
/// of 1 to [`MAX_KEY_CHARS`] visible ASCII characters.
fn idempotency_key(headers: &HeaderMap) -> Result<String, &'static str> {
    let mut values = headers.get_all("idempotency-key").iter();
    let value = values.next().ok_or("the Idempotency-Key header is required")?;
    if values.next().is_some() {
        return Err("send one Idempotency-Key header, not several");
    }
    let bytes = value.as_bytes();
    let key = bytes
        .strip_prefix(b"\"")
        .and_then(|b| b.strip_suffix(b"\""))
        .unwrap_or(bytes);
    if key.is_empty() || key.len() > MAX_KEY_CHARS || !key.iter().all(|b| (0x21..=0x7e).contains(b) && *b != b'"') {
        return Err("the Idempotency-Key must be 1 to 255 visible ASCII characters");
    }
    Ok(String::from_utf8_lossy(key).into_owned())
}

fn stored_reply(stored: &StoredResponse, replayed: bool) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let mut response = (status, stored.body.clone()).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

fn problem(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"error": message}))).into_response()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

// Dropping a reply. A handler cannot close its own connection, so every connection
// is wrapped with a switch ([`ReplyDrop`], handed to handlers as connect info by
// [`listener::serve_wrapped`]): once armed,
// the connection refuses to write, and the server closes it without having sent a
// byte of the response. The sender sees its connection end with no reply — after the
// effect was committed.

/// A connection's switch: armed, the connection writes nothing more.
#[derive(Debug, Clone, Default)]
struct ReplyDrop(Arc<AtomicBool>);

impl ReplyDrop {
    fn arm(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn armed(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A TCP stream that fails every write once its switch is armed.
struct DroppableStream {
    stream: TcpStream,
    reply_drop: ReplyDrop,
}

impl DroppableStream {
    fn dropped() -> io::Error {
        io::Error::new(io::ErrorKind::ConnectionAborted, "reply dropped (--drop-reply-rate)")
    }
}

impl AsyncRead for DroppableStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for DroppableStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.reply_drop.armed() {
            return Poll::Ready(Err(Self::dropped()));
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.reply_drop.armed() {
            return Poll::Ready(Err(Self::dropped()));
        }
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append("idempotency-key", HeaderValue::from_str(v).unwrap());
        }
        map
    }

    #[test]
    fn a_key_is_read_bare_or_quoted() {
        assert_eq!(idempotency_key(&headers(&["ik-1"])).unwrap(), "ik-1");
        assert_eq!(idempotency_key(&headers(&["\"ik-1\""])).unwrap(), "ik-1");
    }

    #[test]
    fn a_missing_repeated_empty_or_oversized_key_is_refused() {
        assert!(idempotency_key(&headers(&[])).unwrap_err().contains("required"));
        assert!(idempotency_key(&headers(&["a", "b"])).unwrap_err().contains("one"));
        let long = "k".repeat(MAX_KEY_CHARS + 1);
        for bad in ["", "\"\"", "has space", long.as_str()] {
            assert!(idempotency_key(&headers(&[bad])).is_err(), "{bad:?}");
        }
        assert!(idempotency_key(&headers(&[&"k".repeat(MAX_KEY_CHARS)])).is_ok());
    }

    #[test]
    fn rates_outside_zero_to_one_name_their_flag() {
        let bad = Faults {
            drop_reply_rate: 1.5,
            ..Faults::none()
        };
        assert_eq!(
            bad.checked().unwrap_err(),
            "--drop-reply-rate 1.5: must be a rate between 0 and 1"
        );
        let nan = Faults {
            fail_rate: f64::NAN,
            ..Faults::none()
        };
        assert!(nan.checked().unwrap_err().starts_with("--fail-rate"));
        let slow = Faults {
            delay: Duration::from_secs(3_600),
            ..Faults::none()
        };
        assert_eq!(slow.checked().unwrap().delay, MAX_DELAY);
    }
}
