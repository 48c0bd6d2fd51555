//! The HTTP listener shared by `leasehold serve` (the API and console, and the
//! metrics port) and `leasehold target`: an accept loop serving hyper HTTP/1
//! connections to an axum [`Router`], with bounds on what one client can hold.
//!
//! - **Header-read timeout** ([`Config::header_timeout`]): a connection that has not
//!   sent a request's complete headers within it is closed. The clock starts when the
//!   server waits for a request, so it also closes a keep-alive connection left idle.
//! - **Request timeout** ([`Config::request_timeout`]): a request whose handling,
//!   reading its body included, takes longer is answered 408 and its connection
//!   closed.
//! - **Header size**: request headers above [`MAX_HEADER_BYTES`] are answered 431.
//! - **Connection cap** ([`Config::max_connections`]): a connection accepted while
//!   that many are open is answered 503 at once, without reading it, and closed;
//!   the connections already open keep being served. Refusals are counted
//!   ([`Served::refused`]) and logged.
//! - **Host check** ([`host_allowed`]): a request whose `Host` names neither an IP
//!   address, `localhost` nor a configured public origin ([`AllowedHosts`]) is
//!   answered 421 before any handler runs, so a page whose DNS name was rebound to
//!   this server's address (DNS rebinding) is refused.
//! - **Bounded shutdown**: when the stop future resolves the listener is closed,
//!   each connection finishes the request it is serving and closes, and when
//!   [`Config::grace`] ends every connection still open is closed
//!   ([`Served::cut_at_grace`]): a server stops within its grace period whatever its
//!   clients do.
//!
//! [`serve_wrapped`] lets a listener wrap each accepted stream and hand handlers a
//! value of its choice as [`ConnectInfo`] (the receiver's switch that drops a reply);
//! [`serve`] hands them the peer's address.

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderValue, Request, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tower::ServiceExt;

/// The default of [`Config::header_timeout`].
pub const HEADER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// The default of [`Config::request_timeout`].
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// The default of [`Config::max_connections`].
pub const MAX_CONNECTIONS_DEFAULT: usize = 512;
/// The default of [`Config::grace`].
pub const GRACE_DEFAULT: Duration = Duration::from_secs(10);
/// The largest request head (request line and headers) read, in bytes.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// How a listener bounds its connections.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long a connection may take to send a request's complete headers, and
    /// stay idle between requests.
    pub header_timeout: Duration,
    /// How long one request's handling may take, reading its body included.
    pub request_timeout: Duration,
    /// How many connections may be open at once (at least 1).
    pub max_connections: usize,
    /// How long requests in flight get to finish after a stop.
    pub grace: Duration,
    /// The host names answered besides IP addresses and `localhost`.
    pub hosts: AllowedHosts,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            header_timeout: HEADER_TIMEOUT_DEFAULT,
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
            max_connections: MAX_CONNECTIONS_DEFAULT,
            grace: GRACE_DEFAULT,
            hosts: AllowedHosts::default(),
        }
    }
}

/// What a listener did, counted from its start to its stop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    /// Connections accepted and served.
    pub accepted: u64,
    /// Connections refused because [`Config::max_connections`] were open.
    pub refused: u64,
    /// Connections still open when the grace period ended, closed then.
    pub cut_at_grace: u64,
}

/// The host names a server answers for besides IP addresses and `localhost`: those
/// of its configured public origins (`--public-origin`), each with its port or none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    origins: Vec<(String, u16)>,
}

impl AllowedHosts {
    /// The hosts of these origins, each `http://HOST[:PORT]` or `https://HOST[:PORT]`
    /// without a path; an error names `flag` and the first origin refused.
    pub fn from_origins<S: AsRef<str>>(flag: &str, origins: impl IntoIterator<Item = S>) -> Result<Self, String> {
        let origins = origins
            .into_iter()
            .map(|o| parse_origin(o.as_ref()).map_err(|why| format!("{flag} {:?}: {why}", o.as_ref())))
            .collect::<Result<_, _>>()?;
        Ok(Self { origins })
    }

    /// Whether a `Host` value (`name[:port]`, `[v6][:port]`) is answered: an IP
    /// address or `localhost` with any port, or a configured origin's host with its
    /// port or none.
    pub fn allows(&self, host: &str) -> bool {
        let Some((name, port)) = split_host(host) else {
            return false;
        };
        if let Some(v6) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
            return v6.parse::<Ipv6Addr>().is_ok();
        }
        name.parse::<Ipv4Addr>().is_ok()
            || name.eq_ignore_ascii_case("localhost")
            || self
                .origins
                .iter()
                .any(|(h, p)| h.eq_ignore_ascii_case(name) && port.is_none_or(|port| port == *p))
    }
}

/// `name[:port]` split; `None` when the port is not a number or the name is empty.
fn split_host(host: &str) -> Option<(&str, Option<u16>)> {
    let (name, port) = match host.rfind([':', ']']) {
        Some(i) if host.as_bytes()[i] == b':' && (!host.starts_with('[') || host[..i].ends_with(']')) => {
            (&host[..i], Some(host[i + 1..].parse::<u16>().ok()?))
        }
        _ => (host, None),
    };
    (!name.is_empty()).then_some((name, port))
}

/// An origin's host (lowercase) and port (the scheme's default when it names none).
fn parse_origin(origin: &str) -> Result<(String, u16), String> {
    let shape = "must be http://HOST[:PORT] or https://HOST[:PORT], with no path";
    let (scheme, rest) = origin.split_once("://").ok_or(shape)?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return Err(format!("the scheme must be http or https ({shape})")),
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']');
    if authority.is_empty() || !authority.chars().all(plain) {
        return Err(shape.to_owned());
    }
    let (name, port) = split_host(authority).ok_or(shape)?;
    let bracketed = name.starts_with('[') && name.ends_with(']');
    if name.contains([':', '[', ']']) && !bracketed {
        return Err(shape.to_owned());
    }
    Ok((name.to_ascii_lowercase(), port.unwrap_or(default_port)))
}

/// Whether a request may be answered by its `Host` (DNS-rebinding defence): one
/// `Host` header that `allowed` allows, and the request line's authority, if any,
/// allowed too. HTTP/1.0 may omit `Host`; HTTP/1.1 may not.
pub fn host_allowed<B>(allowed: &AllowedHosts, request: &Request<B>) -> bool {
    let mut values = request.headers().get_all(header::HOST).iter();
    let (host, repeated) = (values.next(), values.next().is_some());
    if repeated {
        return false;
    }
    if let Some(authority) = request.uri().authority() {
        let bare = authority.as_str().rsplit('@').next().unwrap_or_default();
        if !allowed.allows(bare) {
            return false;
        }
    }
    match host {
        Some(value) => value.to_str().is_ok_and(|h| allowed.allows(h)),
        None => request.version() < Version::HTTP_11,
    }
}

/// A JSON problem answer with this status.
fn problem(status: StatusCode, detail: &str) -> Response {
    let body = serde_json::json!({"title": status.canonical_reason(), "status": status.as_u16(), "detail": detail});
    let mut response = (status, body.to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The 421 of a request whose `Host` is not answered.
fn misdirected() -> Response {
    problem(
        StatusCode::MISDIRECTED_REQUEST,
        "the Host header must name an IP address, localhost or a configured --public-origin",
    )
}

/// The 408 of a request that took longer than the request timeout.
fn timed_out() -> Response {
    let mut response = problem(StatusCode::REQUEST_TIMEOUT, "the request took too long");
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// What every connection shares.
struct Shared {
    router: Router,
    config: Config,
    http: http1::Builder,
}

/// One request: the Host check, then the router within the request timeout, with
/// the connection's `info` as [`ConnectInfo`].
async fn respond<Info: Clone + Send + Sync + 'static>(
    shared: Arc<Shared>,
    info: Info,
    mut request: Request<Incoming>,
) -> Result<Response, Infallible> {
    if !host_allowed(&shared.config.hosts, &request) {
        return Ok(misdirected());
    }
    request.extensions_mut().insert(ConnectInfo(info));
    let handled = shared.router.clone().oneshot(request.map(Body::new));
    match tokio::time::timeout(shared.config.request_timeout, handled).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(never)) => match never {},
        Err(_) => Ok(timed_out()),
    }
}

/// Serves one connection until it ends, or, once `closing` turns true, until its
/// request in flight is answered (the caller bounds that by the grace period).
async fn connection<Io, Info>(
    shared: Arc<Shared>,
    io: Io,
    info: Info,
    mut closing: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) where
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    Info: Clone + Send + Sync + 'static,
{
    let service = {
        let shared = Arc::clone(&shared);
        hyper::service::service_fn(move |request| respond(Arc::clone(&shared), info.clone(), request))
    };
    let conn = shared.http.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = closing.wait_for(|c| *c) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// Answers 503 without reading the request, then closes (the connection cap).
fn refuse(stream: TcpStream, refused: u64, cap: usize) {
    const BUSY: &[u8] =
        b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\nretry-after: 1\r\ncontent-length: 0\r\n\r\n";
    let _ = stream.try_write(BUSY);
    if refused.is_power_of_two() {
        tracing::warn!(
            event = "connection_refused",
            max_connections = cap,
            refused,
            "connection refused: the connection cap is reached"
        );
    }
}

/// Serves `router` on `listener` until `stop` resolves, handlers getting the peer's
/// address as [`ConnectInfo<SocketAddr>`]; see [`serve_wrapped`].
pub async fn serve(
    listener: TcpListener,
    router: Router,
    config: Config,
    stop: impl Future<Output = ()> + Send,
) -> Served {
    serve_wrapped(listener, router, config, |stream, peer| (stream, peer), stop).await
}

/// Serves `router` on `listener` until `stop` resolves, with the bounds of `config`
/// (see the module). Each accepted stream goes through `wrap`, which answers the
/// stream to serve and the value handlers get as [`ConnectInfo`]. Returns once the
/// listener is closed and every connection has ended, within `config.grace` of the
/// stop.
pub async fn serve_wrapped<Io, Info, W>(
    listener: TcpListener,
    router: Router,
    config: Config,
    mut wrap: W,
    stop: impl Future<Output = ()> + Send,
) -> Served
where
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    Info: Clone + Send + Sync + 'static,
    W: FnMut(TcpStream, SocketAddr) -> (Io, Info),
{
    let cap = config.max_connections.max(1);
    let grace = config.grace;
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout)
        .max_header_size(MAX_HEADER_BYTES);
    let shared = Arc::new(Shared { router, config, http });
    let slots = Arc::new(Semaphore::new(cap));
    let (closing, closing_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut served = Served::default();
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            () = &mut stop => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            served.refused += 1;
            refuse(stream, served.refused, cap);
            continue;
        };
        served.accepted += 1;
        let _ = stream.set_nodelay(true);
        let (io, info) = wrap(stream, peer);
        connections.spawn(connection(Arc::clone(&shared), io, info, closing_rx.clone(), slot));
    }
    drop(listener);
    served.cut_at_grace = drain(connections, &closing, grace).await;
    served
}

/// An accept error: a connection that failed before it was accepted is skipped;
/// anything else (out of file descriptors) is logged and waited out briefly.
async fn accept_failed(e: &io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if !matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        tracing::warn!(event = "accept_failed", error = %e, "cannot accept a connection");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Tells every connection to finish, waits up to `grace` for them, then closes the
/// rest; answers how many were closed that way.
async fn drain(mut connections: JoinSet<()>, closing: &watch::Sender<bool>, grace: Duration) -> u64 {
    let _ = closing.send(true);
    let finished = tokio::time::timeout(grace, async { while connections.join_next().await.is_some() {} }).await;
    if finished.is_ok() {
        return 0;
    }
    let cut = connections.len() as u64;
    tracing::info!(
        event = "connections_closed",
        count = cut,
        "grace period over: closing the connections still open"
    );
    connections.shutdown().await;
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(host: Option<&str>, uri: &str, version: Version) -> Request<()> {
        let mut builder = Request::builder().uri(uri).version(version);
        if let Some(h) = host {
            builder = builder.header(header::HOST, h);
        }
        builder.body(()).unwrap()
    }

    fn ops() -> AllowedHosts {
        AllowedHosts::from_origins(
            "--public-origin",
            ["https://ops.example.com", "http://Ops.Internal:8080/"],
        )
        .unwrap()
    }

    #[test]
    fn ip_literals_and_localhost_are_answered_with_any_port() {
        let none = AllowedHosts::default();
        for host in [
            "127.0.0.1",
            "127.0.0.1:8080",
            "10.1.2.3:1",
            "[::1]",
            "[::1]:8080",
            "localhost",
            "LocalHost:9",
        ] {
            assert!(none.allows(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "",
            ":80",
            "127.0.0.1:",
            "127.0.0.1:x",
            "::1",
            "[::1]x",
            "[evil]",
            "localhost.evil",
        ] {
            assert!(!none.allows(host), "{host}");
        }
    }

    #[test]
    fn a_public_origin_is_answered_with_its_port_or_none() {
        let hosts = ops();
        for host in [
            "ops.example.com",
            "OPS.example.com:443",
            "ops.internal:8080",
            "ops.internal",
        ] {
            assert!(hosts.allows(host), "{host}");
        }
        for host in [
            "ops.example.com:80",
            "ops.internal:80",
            "example.com",
            "evil.ops.example.com",
        ] {
            assert!(!hosts.allows(host), "{host}");
        }
    }

    #[test]
    fn a_bad_origin_is_refused_naming_the_flag() {
        for bad in [
            "ops.example.com",
            "ftp://ops",
            "https://ops/path",
            "https://",
            "https://u@ops",
            "https://ops:x",
            "https://ops?q",
        ] {
            let e = AllowedHosts::from_origins("--public-origin", [bad]).unwrap_err();
            assert!(e.starts_with(&format!("--public-origin {bad:?}: ")), "{e}");
        }
    }

    #[test]
    fn the_host_header_decides_and_http_1_1_must_send_it() {
        let hosts = ops();
        assert!(host_allowed(
            &hosts,
            &request(Some("127.0.0.1:1"), "/", Version::HTTP_11)
        ));
        assert!(!host_allowed(
            &hosts,
            &request(Some("evil.example"), "/", Version::HTTP_11)
        ));
        assert!(!host_allowed(&hosts, &request(None, "/", Version::HTTP_11)));
        assert!(host_allowed(&hosts, &request(None, "/", Version::HTTP_10)));
        let absolute = request(Some("127.0.0.1"), "http://evil.example/", Version::HTTP_11);
        assert!(!host_allowed(&hosts, &absolute));
        let mut twice = request(Some("127.0.0.1"), "/", Version::HTTP_11);
        twice
            .headers_mut()
            .append(header::HOST, HeaderValue::from_static("evil.example"));
        assert!(!host_allowed(&hosts, &twice));
    }
}
