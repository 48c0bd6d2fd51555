//! Who is calling, and may they.
//!
//! A request is authenticated by an API token (`Authorization: Bearer …`) or by a
//! console session cookie (`leasehold_session`: HttpOnly, SameSite=Strict, Path=/),
//! made by logging in with a token once (the login form, or a one-time login link).
//! Sessions live in the server's memory and end after [`SESSION_TTL`], at logout,
//! when the server restarts, or as soon as their token is revoked: every request
//! looks its token up again, and revoking through the API ends the token's sessions
//! at once. Only SHA-256 digests of session ids and login codes are kept. Memory is
//! bounded whatever the login rate: a token holds at most [`SESSIONS_PER_TOKEN`]
//! sessions and the server [`SESSIONS_MAX`] (past either, a login ends the oldest
//! session concerned), and expired sessions and codes are dropped when met, at each
//! login, and every [`PRUNE_EVERY`] ([`prune_until`]).
//!
//! Every route checks its role on the server ([`App::require`]), whatever the
//! console shows. State-changing requests (any method but GET, HEAD and OPTIONS) are
//! refused with 403 when `Sec-Fetch-Site` is anything but `same-origin` or `none`,
//! or when `Origin` is present and is not this server's own origin
//! ([`csrf_guard`]). On API routes, such a request authenticated by the session
//! cookie must also declare `Content-Type: application/json`, else 415
//! ([`json_only_for_sessions`]). Every answer carries a strict Content-Security-Policy (scripts
//! and styles only from this server, no inline script) and no-store caching
//! ([`security_headers`]).

use super::problem::Problem;
use super::App;
use crate::tokens::{token_hash, Role, TokenInfo};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a console session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// How long a one-time login link stays valid.
pub const LOGIN_CODE_TTL: Duration = Duration::from_secs(15 * 60);
/// The most sessions one token holds: its next login ends its oldest session.
pub const SESSIONS_PER_TOKEN: usize = 16;
/// The most sessions the server holds: past it, a login ends the oldest session of
/// all (a login always succeeds; refusing logins instead would let whoever filled
/// the table keep everyone out of the console for [`SESSION_TTL`]).
pub const SESSIONS_MAX: usize = 10_000;
/// The most unused login codes the server holds: past it, the oldest is dropped.
pub const LOGIN_CODES_MAX: usize = 64;
/// How often `serve` drops expired sessions and login codes.
pub const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// The session cookie's name.
pub const SESSION_COOKIE: &str = "leasehold_session";
/// The Content-Security-Policy of every answer.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                       connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The token's name.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Whether it came by session cookie (the console) rather than a bearer token.
    pub by_session: bool,
}

impl Principal {
    fn of(token: TokenInfo, by_session: bool) -> Self {
        Self {
            name: token.name,
            role: token.role,
            by_session,
        }
    }
}

struct Expiring {
    token_hash: String,
    until: Instant,
}

/// A live session: its token, its end, and its place in the opening order.
struct Session {
    token_hash: String,
    until: Instant,
    seq: u64,
}

/// The sessions of one token, oldest first.
struct Owner {
    name: String,
    seqs: VecDeque<u64>,
}

/// Every session, reachable by its id's digest, by opening order and by token.
/// Every session lasts [`SESSION_TTL`], so opening order is also expiry order.
#[derive(Default)]
struct Table {
    by_id: HashMap<String, Session>,
    by_age: BTreeMap<u64, String>,
    by_token: HashMap<String, Owner>,
    next: u64,
}

impl Table {
    fn insert(&mut self, digest: String, token_hash: String, token_name: &str, until: Instant) {
        let seq = self.next;
        self.next += 1;
        self.by_token
            .entry(token_hash.clone())
            .or_insert_with(|| Owner {
                name: token_name.to_owned(),
                seqs: VecDeque::new(),
            })
            .seqs
            .push_back(seq);
        self.by_age.insert(seq, digest.clone());
        self.by_id.insert(digest, Session { token_hash, until, seq });
    }

    fn remove(&mut self, digest: &str) {
        let Some(session) = self.by_id.remove(digest) else {
            return;
        };
        self.by_age.remove(&session.seq);
        if let Some(owner) = self.by_token.get_mut(&session.token_hash) {
            owner.seqs.retain(|s| *s != session.seq);
            if owner.seqs.is_empty() {
                self.by_token.remove(&session.token_hash);
            }
        }
    }

    fn remove_seq(&mut self, seq: u64) {
        if let Some(digest) = self.by_age.get(&seq).cloned() {
            self.remove(&digest);
        }
    }

    /// Ends the expired sessions, oldest first; answers how many.
    fn prune(&mut self, now: Instant) -> usize {
        let mut pruned = 0;
        while let Some((_, digest)) = self.by_age.first_key_value() {
            if self.by_id.get(digest).is_some_and(|s| s.until > now) {
                break;
            }
            let digest = digest.clone();
            self.remove(&digest);
            pruned += 1;
        }
        pruned
    }

    /// Ends sessions until `token_hash` may open one more within both caps.
    fn make_room(&mut self, token_hash: &str) {
        while let Some(oldest) = self
            .by_token
            .get(token_hash)
            .filter(|o| o.seqs.len() >= SESSIONS_PER_TOKEN)
            .and_then(|o| o.seqs.front().copied())
        {
            self.remove_seq(oldest);
        }
        while self.by_id.len() >= SESSIONS_MAX {
            let Some(oldest) = self.by_age.keys().next().copied() else {
                break;
            };
            self.remove_seq(oldest);
        }
    }
}

/// Console sessions and one-time login codes, by the SHA-256 of their secret.
/// Both are bounded ([`SESSIONS_PER_TOKEN`], [`SESSIONS_MAX`], [`LOGIN_CODES_MAX`])
/// and expired ones are dropped when met, at each login, and by [`Sessions::prune`]
/// (which `serve` calls every [`PRUNE_EVERY`]).
///
/// Every method takes the time as `now`, so that expiry is decided by the caller's
/// clock (`Instant::now()` in the server).
#[derive(Default)]
pub struct Sessions {
    table: Mutex<Table>,
    codes: Mutex<HashMap<String, Expiring>>,
}

fn random_secret() -> Result<String, Problem> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|_| {
        Problem::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "no randomness",
        )
    })?;
    Ok(hex::encode(bytes))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Sessions {
    /// A new session for the token with this hash and name; answers the cookie
    /// value. It ends that token's oldest session when the token already holds
    /// [`SESSIONS_PER_TOKEN`], and the oldest session of all when the server holds
    /// [`SESSIONS_MAX`].
    pub fn open(&self, token_hash: String, token_name: &str, now: Instant) -> Result<String, Problem> {
        let id = random_secret()?;
        let mut table = lock(&self.table);
        table.prune(now);
        table.make_room(&token_hash);
        table.insert(super::sha256(&id), token_hash, token_name, now + SESSION_TTL);
        Ok(id)
    }

    /// The token hash of a live session; an expired one is dropped.
    fn token_of(&self, session_id: &str, now: Instant) -> Option<String> {
        let digest = super::sha256(session_id);
        let mut table = lock(&self.table);
        let session = table.by_id.get(&digest)?;
        if session.until > now {
            return Some(session.token_hash.clone());
        }
        table.remove(&digest);
        None
    }

    /// Ends a session.
    pub fn close(&self, session_id: &str) {
        lock(&self.table).remove(&super::sha256(session_id));
    }

    /// Ends every session of the token named `token_name` (a token is revoked by
    /// name); answers how many.
    pub fn close_token(&self, token_name: &str) -> usize {
        self.close_owners(|_, owner| owner.name == token_name)
    }

    /// Ends every session of the token with this hash.
    fn close_token_hash(&self, token_hash: &str) -> usize {
        self.close_owners(|hash, _| hash == token_hash)
    }

    fn close_owners(&self, pick: impl Fn(&str, &Owner) -> bool) -> usize {
        let mut table = lock(&self.table);
        let seqs: Vec<u64> = table
            .by_token
            .iter()
            .filter(|(hash, owner)| pick(hash, owner))
            .flat_map(|(_, owner)| owner.seqs.iter().copied())
            .collect();
        for seq in &seqs {
            table.remove_seq(*seq);
        }
        seqs.len()
    }

    /// Drops the expired sessions and login codes; answers how many of each.
    pub fn prune(&self, now: Instant) -> (usize, usize) {
        let sessions = lock(&self.table).prune(now);
        let mut codes = lock(&self.codes);
        let before = codes.len();
        codes.retain(|_, c| c.until > now);
        (sessions, before - codes.len())
    }

    /// How many sessions the server holds (live, or expired and not yet dropped).
    pub fn session_count(&self) -> usize {
        lock(&self.table).by_id.len()
    }

    /// How many login codes the server holds.
    pub fn code_count(&self) -> usize {
        lock(&self.codes).len()
    }

    /// A one-time login code for the token with this hash, valid for
    /// [`LOGIN_CODE_TTL`]. Past [`LOGIN_CODES_MAX`], the oldest code is dropped.
    pub fn login_code(&self, token_hash: String, now: Instant) -> Result<String, Problem> {
        let code = random_secret()?;
        let mut codes = lock(&self.codes);
        codes.retain(|_, c| c.until > now);
        while codes.len() >= LOGIN_CODES_MAX {
            let Some(oldest) = codes.iter().min_by_key(|(_, c)| c.until).map(|(k, _)| k.clone()) else {
                break;
            };
            codes.remove(&oldest);
        }
        let until = now + LOGIN_CODE_TTL;
        codes.insert(super::sha256(&code), Expiring { token_hash, until });
        Ok(code)
    }

    /// Uses a login code up: answers its token hash once, if it is still valid.
    pub fn redeem(&self, code: &str, now: Instant) -> Option<String> {
        let taken = lock(&self.codes).remove(&super::sha256(code))?;
        (taken.until > now).then_some(taken.token_hash)
    }
}

/// Drops `app`'s expired sessions and login codes every `period` until `stop`
/// resolves.
pub async fn prune_until(app: App, period: Duration, stop: impl Future<Output = ()>) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            _ = ticks.tick() => {
                let (sessions, codes) = app.sessions().prune(Instant::now());
                if sessions + codes > 0 {
                    tracing::debug!(event = "sessions_pruned", sessions, codes, "expired sessions dropped");
                }
            }
        }
    }
}

/// The value of cookie `name` in the request.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The `Set-Cookie` value that opens a session.
pub fn session_cookie(id: &str) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        SESSION_TTL.as_secs()
    ))
    .unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The `Set-Cookie` value that ends a session.
pub fn clear_cookie() -> HeaderValue {
    HeaderValue::from_static("leasehold_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
}

impl App {
    /// The caller, if the request carries a valid token or session. A malformed or
    /// unknown bearer token is 401 (it is never silently ignored).
    pub async fn principal(&self, headers: &HeaderMap) -> Result<Option<Principal>, Problem> {
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let value = value.to_str().map_err(|_| Problem::unauthorized())?;
            let (scheme, token) = value.split_once(' ').ok_or_else(Problem::unauthorized)?;
            if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
                return Err(Problem::unauthorized());
            }
            let found = self.backend().token_by_hash(&token_hash(token.trim())).await?;
            return found
                .map(|t| Some(Principal::of(t, false)))
                .ok_or_else(Problem::unauthorized);
        }
        let Some(session) = cookie(headers, SESSION_COOKIE) else {
            return Ok(None);
        };
        let Some(hash) = self.sessions().token_of(session, Instant::now()) else {
            return Ok(None);
        };
        match self.backend().token_by_hash(&hash).await? {
            Some(token) => Ok(Some(Principal::of(token, true))),
            None => {
                // Its token was revoked (here or by another process): every session
                // of that token ends with it.
                self.sessions().close_token_hash(&hash);
                Ok(None)
            }
        }
    }

    /// The caller, who must have at least `role`: 401 without credentials, 403
    /// with too weak a role.
    pub async fn require(&self, headers: &HeaderMap, role: Role) -> Result<Principal, Problem> {
        let who = self.principal(headers).await?.ok_or_else(Problem::unauthorized)?;
        if who.role.allows(role) {
            Ok(who)
        } else {
            let allowed: Vec<&str> = Role::ALL
                .iter()
                .filter(|r| r.allows(role))
                .map(|r| r.as_str())
                .collect();
            Err(Problem::forbidden(format!(
                "this needs the {} role; token {} is {}",
                allowed.join(" or "),
                who.name,
                who.role
            )))
        }
    }
}

/// Whether a request is cross-site by its `Sec-Fetch-Site` and `Origin` headers.
pub fn cross_site(headers: &HeaderMap) -> Option<&'static str> {
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return Some("cross-site request refused (Sec-Fetch-Site)");
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        let origin = origin.to_str().unwrap_or("null");
        let ours = !host.is_empty() && (origin == format!("http://{host}") || origin == format!("https://{host}"));
        if !ours {
            return Some("cross-origin request refused (Origin)");
        }
    }
    None
}

/// Whether a request with this method may change state (any but GET, HEAD and
/// OPTIONS).
fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Refuses state-changing cross-site requests with 403.
pub async fn csrf_guard(request: Request, next: Next) -> Response {
    if changes_state(request.method()) {
        if let Some(why) = cross_site(request.headers()) {
            return Problem::forbidden(why).into_response();
        }
    }
    next.run(request).await
}

/// Whether a request would be authenticated by the session cookie: it carries the
/// cookie and no `Authorization` header (which would take precedence).
fn by_session_cookie(headers: &HeaderMap) -> bool {
    !headers.contains_key(header::AUTHORIZATION) && cookie(headers, SESSION_COOKIE).is_some()
}

/// Whether the request declares a JSON body (`application/json`, parameters such as
/// `charset` allowed).
fn declares_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|kind| kind.trim().eq_ignore_ascii_case("application/json"))
}

/// On API routes: a state-changing request that the session cookie would
/// authenticate must declare `Content-Type: application/json`, else 415 before the
/// handler runs. A page elsewhere cannot send that type across sites without a CORS
/// preflight, which this server never grants. Bearer-token requests pass.
pub async fn json_only_for_sessions(request: Request, next: Next) -> Response {
    let headers = request.headers();
    if changes_state(request.method()) && by_session_cookie(headers) && !declares_json(headers) {
        return Problem::unsupported_media_type(
            "Content-Type: a change made with the console's session cookie must be application/json",
        )
        .into_response();
    }
    next.run(request).await
}

/// Adds the security headers to every answer.
pub async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn only_same_origin_or_direct_requests_pass() {
        assert_eq!(cross_site(&headers(&[])), None);
        assert_eq!(cross_site(&headers(&[("sec-fetch-site", "same-origin")])), None);
        assert_eq!(cross_site(&headers(&[("sec-fetch-site", "none")])), None);
        assert!(cross_site(&headers(&[("sec-fetch-site", "cross-site")])).is_some());
        assert!(cross_site(&headers(&[("sec-fetch-site", "same-site")])).is_some());
        let ours = headers(&[("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:8080")]);
        assert_eq!(cross_site(&ours), None);
        assert!(cross_site(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://evil.example")
        ]))
        .is_some());
        assert!(cross_site(&headers(&[("host", "127.0.0.1:8080"), ("origin", "null")])).is_some());
    }

    #[test]
    fn a_login_code_works_once() {
        let s = Sessions::default();
        let now = Instant::now();
        let code = s.login_code("h".into(), now).unwrap();
        assert_eq!(s.redeem(&code, now).as_deref(), Some("h"));
        assert_eq!(s.redeem(&code, now), None);
        assert_eq!(s.redeem("guess", now), None);
        let late = s.login_code("h".into(), now).unwrap();
        assert_eq!(s.redeem(&late, now + LOGIN_CODE_TTL), None, "expired");
    }

    /// The three indexes of the table hold the same sessions.
    fn assert_consistent(s: &Sessions) {
        let table = lock(&s.table);
        let by_token: usize = table.by_token.values().map(|o| o.seqs.len()).sum();
        assert_eq!(table.by_age.len(), table.by_id.len());
        assert_eq!(by_token, table.by_id.len());
        assert!(table.by_token.values().all(|o| !o.seqs.is_empty()));
    }

    fn token_sessions(s: &Sessions, hash: &str) -> usize {
        lock(&s.table).by_token.get(hash).map_or(0, |o| o.seqs.len())
    }

    #[test]
    fn one_token_logging_in_without_end_holds_its_cap_and_its_newest_sessions() {
        let s = Sessions::default();
        let now = Instant::now();
        let ids: Vec<String> = (0..20_000).map(|_| s.open("h".into(), "bot", now).unwrap()).collect();
        assert_eq!(s.session_count(), SESSIONS_PER_TOKEN);
        assert_consistent(&s);
        let (evicted, kept) = ids.split_at(ids.len() - SESSIONS_PER_TOKEN);
        for id in kept {
            assert_eq!(s.token_of(id, now).as_deref(), Some("h"));
        }
        assert_eq!(s.token_of(&evicted[0], now), None, "the first session ended");
        assert_eq!(
            s.token_of(evicted.last().unwrap(), now),
            None,
            "the last one past the cap ended"
        );
    }

    #[test]
    fn many_tokens_logging_in_without_end_hold_the_total_cap_and_the_newest_sessions() {
        let s = Sessions::default();
        let now = Instant::now();
        let tokens = 2 * SESSIONS_MAX / SESSIONS_PER_TOKEN;
        let mut ids = Vec::new();
        for round in 0..SESSIONS_PER_TOKEN {
            for t in 0..tokens {
                ids.push((t, round, s.open(format!("h{t}"), &format!("t{t}"), now).unwrap()));
            }
        }
        assert_eq!(s.session_count(), SESSIONS_MAX);
        assert_consistent(&s);
        let (first_token, _, first) = &ids[0];
        assert_eq!(s.token_of(first, now), None, "the oldest session of all ended");
        assert_eq!(token_sessions(&s, &format!("h{first_token}")), SESSIONS_MAX / tokens);
        let (last_token, _, last) = ids.last().unwrap();
        assert_eq!(s.token_of(last, now), Some(format!("h{last_token}")));
    }

    #[test]
    fn the_prune_drops_expired_sessions_and_codes_and_keeps_live_ones() {
        let s = Sessions::default();
        let start = Instant::now();
        for t in 0..50 {
            s.open(format!("h{t}"), "old", start).unwrap();
            s.login_code(format!("h{t}"), start).unwrap();
        }
        let later = start + Duration::from_secs(60);
        let fresh = s.open("fresh".into(), "fresh", later).unwrap();
        let code = s.login_code("fresh".into(), later).unwrap();
        assert_eq!(
            s.prune(start + SESSION_TTL - Duration::from_secs(1)),
            (0, 51),
            "only the codes expired"
        );
        assert_eq!((s.session_count(), s.code_count()), (51, 0));
        assert_eq!(s.prune(start + SESSION_TTL), (50, 0));
        assert_eq!(s.session_count(), 1);
        assert_consistent(&s);
        assert_eq!(lock(&s.table).by_token.len(), 1, "no entry left for the expired tokens");
        assert_eq!(s.token_of(&fresh, start + SESSION_TTL).as_deref(), Some("fresh"));
        assert_eq!(
            s.redeem(&code, start + SESSION_TTL),
            None,
            "the code expired with the others"
        );
        assert_eq!(s.prune(later + SESSION_TTL), (1, 0));
        assert_eq!((s.session_count(), s.code_count()), (0, 0));
    }

    #[test]
    fn an_expired_session_is_dropped_when_used() {
        let s = Sessions::default();
        let start = Instant::now();
        let id = s.open("h".into(), "t", start).unwrap();
        assert_eq!(s.token_of(&id, start + SESSION_TTL), None);
        assert_eq!(s.session_count(), 0);
        assert_consistent(&s);
    }

    #[test]
    fn login_codes_are_capped() {
        let s = Sessions::default();
        let now = Instant::now();
        let first = s.login_code("h".into(), now).unwrap();
        for n in 1..3 * LOGIN_CODES_MAX {
            s.login_code("h".into(), now + Duration::from_millis(n as u64)).unwrap();
        }
        assert_eq!(s.code_count(), LOGIN_CODES_MAX);
        assert_eq!(s.redeem(&first, now), None, "the oldest code was dropped");
    }

    #[test]
    fn closing_a_token_ends_only_its_sessions() {
        let s = Sessions::default();
        let now = Instant::now();
        let a: Vec<String> = (0..3).map(|_| s.open("ha".into(), "a", now).unwrap()).collect();
        let b = s.open("hb".into(), "b", now).unwrap();
        assert_eq!(s.close_token("a"), 3);
        assert!(a.iter().all(|id| s.token_of(id, now).is_none()));
        assert_eq!(s.token_of(&b, now).as_deref(), Some("hb"));
        assert_eq!(s.close_token_hash("hb"), 1);
        assert_eq!(s.session_count(), 0);
        assert_consistent(&s);
    }

    #[test]
    fn a_closed_session_no_longer_resolves() {
        let s = Sessions::default();
        let now = Instant::now();
        let (one, two) = (
            s.open("h".into(), "t", now).unwrap(),
            s.open("h".into(), "t", now).unwrap(),
        );
        s.close(&one);
        assert_eq!(s.token_of(&one, now), None);
        assert_eq!(s.token_of(&two, now).as_deref(), Some("h"));
        assert_consistent(&s);
    }

    #[test]
    fn only_declared_json_passes_for_a_session_cookie() {
        assert!(declares_json(&headers(&[("content-type", "application/json")])));
        assert!(declares_json(&headers(&[(
            "content-type",
            "Application/JSON; charset=utf-8"
        )])));
        for kind in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "application/jsonp",
            "",
        ] {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_str(kind).unwrap());
            assert!(!declares_json(&h), "{kind}");
        }
        assert!(!declares_json(&headers(&[])));
        assert!(by_session_cookie(&headers(&[("cookie", "leasehold_session=x")])));
        assert!(!by_session_cookie(&headers(&[
            ("cookie", "leasehold_session=x"),
            ("authorization", "Bearer lh_x")
        ])));
        assert!(!by_session_cookie(&headers(&[("cookie", "other=x")])));
    }

    #[tokio::test]
    async fn the_prune_timer_ends_when_its_server_stops() {
        let ledger = std::sync::Arc::new(crate::ledger::memory::MemoryLedger::new(
            std::sync::Arc::new(crate::clock::SystemClock),
            std::sync::Arc::new(crate::entropy::OsEntropy),
        ));
        let app = App::new(ledger, &[]);
        let task = tokio::spawn(prune_until(app, Duration::from_millis(1), std::future::ready(())));
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the timer ended")
            .expect("no panic");
    }

    #[test]
    fn cookies_are_found_by_name() {
        let h = headers(&[("cookie", "a=1; leasehold_session=abc; b=2")]);
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "c"), None);
    }
}
