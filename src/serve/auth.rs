//! Who is calling, and may they.
//!
//! A request is authenticated by an API token (`Authorization: Bearer …`) or by a
//! console session cookie (`leasehold_session`: HttpOnly, SameSite=Strict, Path=/),
//! made by logging in with a token once (the login form, or a one-time login link).
//! Sessions live in the server's memory and end after [`SESSION_TTL`], at logout,
//! when the server restarts, or as soon as their token is revoked: every request
//! looks its token up again. Only SHA-256 digests of session ids and login codes are
//! kept.
//!
//! Every route checks its role on the server ([`App::require`]), whatever the
//! console shows. State-changing requests (any method but GET, HEAD and OPTIONS) are
//! refused with 403 when `Sec-Fetch-Site` is anything but `same-origin` or `none`,
//! or when `Origin` is present and is not this server's own origin
//! ([`csrf_guard`]). Every answer carries a strict Content-Security-Policy (scripts
//! and styles only from this server, no inline script) and no-store caching
//! ([`security_headers`]).

use super::problem::Problem;
use super::App;
use crate::tokens::{token_hash, Role, TokenInfo};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a console session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// How long a one-time login link stays valid.
pub const LOGIN_CODE_TTL: Duration = Duration::from_secs(15 * 60);
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

/// Console sessions and one-time login codes, by the SHA-256 of their secret.
#[derive(Default)]
pub struct Sessions {
    sessions: Mutex<HashMap<String, Expiring>>,
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
    /// A new session for the token with this hash; answers the cookie value.
    pub fn open(&self, token_hash: String) -> Result<String, Problem> {
        let id = random_secret()?;
        let now = Instant::now();
        let mut sessions = lock(&self.sessions);
        sessions.retain(|_, s| s.until > now);
        sessions.insert(
            super::sha256(&id),
            Expiring {
                token_hash,
                until: now + SESSION_TTL,
            },
        );
        Ok(id)
    }

    /// The token hash of a live session.
    fn token_of(&self, session_id: &str) -> Option<String> {
        let sessions = lock(&self.sessions);
        sessions
            .get(&super::sha256(session_id))
            .filter(|s| s.until > Instant::now())
            .map(|s| s.token_hash.clone())
    }

    /// Ends a session.
    pub fn close(&self, session_id: &str) {
        lock(&self.sessions).remove(&super::sha256(session_id));
    }

    /// A one-time login code for the token with this hash, valid for
    /// [`LOGIN_CODE_TTL`].
    pub fn login_code(&self, token_hash: String) -> Result<String, Problem> {
        let code = random_secret()?;
        lock(&self.codes).insert(
            super::sha256(&code),
            Expiring {
                token_hash,
                until: Instant::now() + LOGIN_CODE_TTL,
            },
        );
        Ok(code)
    }

    /// Uses a login code up: answers its token hash once, if it is still valid.
    pub fn redeem(&self, code: &str) -> Option<String> {
        let taken = lock(&self.codes).remove(&super::sha256(code))?;
        (taken.until > Instant::now()).then_some(taken.token_hash)
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
        let Some(hash) = self.sessions().token_of(session) else {
            return Ok(None);
        };
        match self.backend().token_by_hash(&hash).await? {
            Some(token) => Ok(Some(Principal::of(token, true))),
            None => {
                // Its token was revoked: the session ends with it.
                self.sessions().close(session);
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
            Err(Problem::forbidden(format!(
                "this needs the {role} role; token {} is {}",
                who.name, who.role
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

/// Refuses state-changing cross-site requests with 403.
pub async fn csrf_guard(request: Request, next: Next) -> Response {
    let safe = matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if !safe {
        if let Some(why) = cross_site(request.headers()) {
            return Problem::forbidden(why).into_response();
        }
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
        let code = s.login_code("h".into()).unwrap();
        assert_eq!(s.redeem(&code).as_deref(), Some("h"));
        assert_eq!(s.redeem(&code), None);
        assert_eq!(s.redeem("guess"), None);
    }

    #[test]
    fn cookies_are_found_by_name() {
        let h = headers(&[("cookie", "a=1; leasehold_session=abc; b=2")]);
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "c"), None);
    }
}
