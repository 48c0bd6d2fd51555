//! Errors as `application/problem+json` (RFC 9457), with the CLI's meanings: 400
//! bad input, 422 invalid plan, 401 no or unknown token, 403 not permitted, 404 not
//! found, 409 refused by the engine, 415 a console session's change that is not
//! JSON, 503 ledger unavailable, 500 anything else.
//!
//! A 5xx answer never carries the ledger's own message (it can name the database):
//! the message goes to the log, redacted, and the answer says only what kind of
//! failure it was.

use crate::ledger::LedgerError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use leasehold_engine::Refusal;
use serde::Serialize;

/// The media type of every error answer.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// Always `about:blank`: `code` says which problem this is.
    #[serde(rename = "type")]
    pub kind: String,
    /// The HTTP status text.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong, for a person.
    pub detail: String,
    /// A stable machine-readable name: `bad_input`, `invalid_plan`, `unauthorized`,
    /// `forbidden`, `not_found`, `refused`, `unsupported_media_type`, `unavailable`,
    /// `outcome_unknown`, `internal`.
    pub code: String,
}

impl Problem {
    /// A problem with this status, code and detail.
    pub fn new(status: StatusCode, code: &str, detail: impl Into<String>) -> Self {
        Self {
            kind: "about:blank".into(),
            title: status.canonical_reason().unwrap_or("Error").into(),
            status: status.as_u16(),
            detail: crate::text::clean(&detail.into()).into_owned(),
            code: code.into(),
        }
    }

    /// 400.
    pub fn bad_input(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_input", detail)
    }

    /// 401.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send an API token (Authorization: Bearer …) or log in to the console",
        )
    }

    /// 403.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", detail)
    }

    /// 404.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", detail)
    }

    /// 415.
    pub fn unsupported_media_type(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", detail)
    }

    /// The status as a [`StatusCode`].
    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl From<LedgerError> for Problem {
    fn from(e: LedgerError) -> Self {
        match &e {
            LedgerError::Refused(r @ Refusal::KeyReused { .. }) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "key_reused", r.to_string())
            }
            LedgerError::Refused(r) => Self::new(StatusCode::CONFLICT, "refused", r.to_string()),
            LedgerError::InvalidPlan(p) => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_plan", p.to_string()),
            LedgerError::NotFound { .. } => Self::not_found(e.to_string()),
            LedgerError::BadInput(m) => Self::bad_input(m.clone()),
            _ => {
                tracing::error!(error = %super::logs::redacted(&e.to_string()), "ledger request failed");
                match e {
                    LedgerError::Unavailable(_) => Self::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "unavailable",
                        "the ledger is unavailable; nothing was written; try again (the server log has the cause)",
                    ),
                    LedgerError::Ambiguous(_) => Self::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "outcome_unknown",
                        "the connection to the ledger was lost: the request may or may not have been applied; read the attempt before retrying",
                    ),
                    _ => Self::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        "internal error (the server log has the cause)",
                    ),
                }
            }
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status_code();
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
