//! How PostgreSQL errors become ledger errors, and which of them a transaction retries.
//!
//! Contract: [`TxError::Retry`] means nothing was committed and running the whole
//! transaction again may succeed: a serialization failure (`40001`), a deadlock
//! (`40P01`), a lock timeout (`55P03`), or a connection lost before `COMMIT` was sent
//! (the server rolls an unfinished transaction back when its session ends). A
//! connection lost while `COMMIT` was in flight is [`TxError::Ambiguous`]: it may or may
//! not have applied, so it is never retried blindly. Failing to connect at all is
//! [`LedgerError::Unavailable`]. Messages name the server's error code and text, never
//! a lease token or a password (values are bound as parameters, and PostgreSQL's
//! messages for the errors above quote no parameter).

use crate::ledger::LedgerError;
use tokio_postgres::error::SqlState;

pub(crate) use crate::ledger::sql::TxError;

/// Where in a transaction an error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// A statement before `COMMIT`: nothing can have been committed.
    Statement,
    /// `COMMIT` itself.
    Commit,
}

/// The SQLSTATEs after which the whole transaction is tried again.
const RETRY: &[SqlState] = &[
    SqlState::T_R_SERIALIZATION_FAILURE,
    SqlState::T_R_DEADLOCK_DETECTED,
    SqlState::LOCK_NOT_AVAILABLE,
];

/// The SQLSTATEs that mean the server is going away or refused the session: the
/// transaction did not commit (before `COMMIT`) and the ledger may come back.
const GOING_AWAY: &[SqlState] = &[
    SqlState::ADMIN_SHUTDOWN,
    SqlState::CRASH_SHUTDOWN,
    SqlState::CANNOT_CONNECT_NOW,
    SqlState::TOO_MANY_CONNECTIONS,
    SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
];

/// Classifies an error of a statement sent in `phase`.
pub(super) fn classify(e: &tokio_postgres::Error, phase: Phase) -> TxError {
    let text = describe(e);
    if let Some(code) = e.code() {
        if RETRY.contains(code) {
            return TxError::Retry(text);
        }
        if !GOING_AWAY.contains(code) {
            // The server answered with an error: whatever it was, it rolled back.
            return TxError::Ledger(LedgerError::Internal(text));
        }
    }
    // No answer (the connection closed or broke), or the server is going away.
    match phase {
        Phase::Statement => TxError::Retry(text),
        Phase::Commit => TxError::Ambiguous(format!("connection lost during COMMIT: {text}")),
    }
}

/// `postgres 40001: could not serialize access …`, or the driver's own text.
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("postgres {}: {}", db.code().code(), db.message()),
        None => format!("postgres: {e}"),
    }
}

/// `Unavailable` for an error met while connecting (nothing was sent).
pub(super) fn unavailable(server: &str, e: &dyn std::fmt::Display) -> LedgerError {
    LedgerError::Unavailable(format!("postgres at {server}: {e}"))
}

/// Maps a pool error to a ledger error: a timeout or a failed connect is `Unavailable`.
pub(super) fn pool_error(server: &str, e: deadpool_postgres::PoolError) -> LedgerError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => unavailable(server, &describe(&e)),
        other => unavailable(server, &other),
    }
}
