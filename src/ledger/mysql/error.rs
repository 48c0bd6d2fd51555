//! How MySQL errors become ledger errors, and which of them a transaction retries.
//!
//! Contract: [`TxError::Retry`] means nothing was committed and running the whole
//! transaction again may succeed: a deadlock (1213), a lock-wait timeout (1205), a
//! MariaDB snapshot conflict (1020), or a connection lost before `COMMIT` was sent (the
//! server rolls an unfinished transaction back when its connection goes). A connection
//! lost while `COMMIT` was in flight is [`TxError::Ambiguous`]: it may or may not have
//! applied, so it is never retried blindly. On Galera, a certification conflict
//! (another node committed a write to the same rows first) is a deadlock (1213), at
//! `COMMIT` or at the next statement, and its transaction rolled back whole: retried.
//! A node outside the primary component (1047, 1180) counts as a lost connection. Failing to connect at all is
//! [`LedgerError::Unavailable`]. Messages name the server error, never a lease token
//! or a password (tokens are bound as parameters, which no MySQL error echoes).

use crate::ledger::LedgerError;
use mysql_async::{DriverError, Error as MyError};

pub(crate) use crate::ledger::sql::TxError;

/// Where in a transaction an error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Taking a connection: nothing was sent.
    Connect,
    /// A statement before `COMMIT`: nothing can have been committed.
    Statement,
    /// `COMMIT` itself.
    Commit,
}

/// Deadlock found when trying to get lock.
pub(super) const ER_LOCK_DEADLOCK: u16 = 1213;
/// Lock wait timeout exceeded.
pub(super) const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
/// MariaDB: record has changed since last read (snapshot isolation conflict).
const ER_CHECKREAD: u16 = 1020;
/// Server shutdown in progress.
const ER_SERVER_SHUTDOWN: u16 = 1053;
/// Query execution was interrupted.
const ER_QUERY_INTERRUPTED: u16 = 1317;
/// MariaDB: connection was killed.
const ER_CONNECTION_KILLED: u16 = 1927;
/// MySQL 8: the client was disconnected by the server because of inactivity.
const ER_CLIENT_INTERACTION_TIMEOUT: u16 = 4031;
/// Galera: "WSREP has not yet prepared node for application use" — the node is not
/// part of the cluster's primary component (it lost quorum, or is still joining) and
/// serves no statement until it is.
const ER_WSREP_NOT_READY: u16 = 1047;
/// Galera: "Error while appending streaming replication fragment" — the node lost
/// the primary component while its transaction was being replicated.
const ER_WSREP_REPLICATION: u16 = 1180;
/// Table doesn't exist.
pub(super) const ER_NO_SUCH_TABLE: u16 = 1146;
/// Unknown column.
pub(super) const ER_BAD_FIELD_ERROR: u16 = 1054;

/// Whether the server error code means "try the transaction again".
pub(super) fn is_conflict(code: u16) -> bool {
    matches!(code, ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT | ER_CHECKREAD)
}

/// Whether the error means the connection is gone.
fn is_connection_loss(e: &MyError) -> bool {
    match e {
        MyError::Io(_) | MyError::Other(_) => true,
        MyError::Driver(d) => matches!(
            d,
            DriverError::ConnectionClosed | DriverError::PacketOutOfOrder | DriverError::UnexpectedPacket { .. }
        ),
        MyError::Server(s) => matches!(
            s.code,
            ER_SERVER_SHUTDOWN
                | ER_QUERY_INTERRUPTED
                | ER_CONNECTION_KILLED
                | ER_CLIENT_INTERACTION_TIMEOUT
                | ER_WSREP_NOT_READY
                | ER_WSREP_REPLICATION
        ),
        MyError::Url(_) => false,
    }
}

/// Classifies a driver error raised in `phase`.
pub(super) fn classify(e: &MyError, phase: Phase) -> TxError {
    let message = format!("mysql: {e}");
    if is_connection_loss(e) {
        return match phase {
            Phase::Connect => TxError::Ledger(LedgerError::Unavailable(message)),
            Phase::Statement => TxError::Retry(message),
            Phase::Commit => TxError::Ambiguous(message),
        };
    }
    match e {
        MyError::Server(s) if is_conflict(s.code) => TxError::Retry(message),
        // Access denied, unknown database, too many connections, …: the server
        // answered but will not serve us now.
        MyError::Server(_) if phase == Phase::Connect => TxError::Ledger(LedgerError::Unavailable(message)),
        MyError::Server(s) if s.code == ER_NO_SUCH_TABLE => TxError::Ledger(LedgerError::Internal(format!(
            "{message} (is the schema missing? run `leasehold migrate`)"
        ))),
        MyError::Driver(DriverError::PoolDisconnected) => TxError::Ledger(LedgerError::Unavailable(message)),
        MyError::Driver(DriverError::FromValue { .. } | DriverError::FromRow { .. }) => {
            TxError::Ledger(LedgerError::Integrity("mysql: a row does not convert".into()))
        }
        MyError::Url(_) => TxError::Ledger(LedgerError::BadInput(message)),
        _ => TxError::Ledger(LedgerError::Internal(message)),
    }
}

/// `.db()` on a driver result: the error classified as raised by a statement.
pub(super) trait DbResult<T> {
    /// The result with its error classified ([`Phase::Statement`]).
    fn db(self) -> Result<T, TxError>;
}

impl<T> DbResult<T> for Result<T, MyError> {
    fn db(self) -> Result<T, TxError> {
        self.map_err(|e| classify(&e, Phase::Statement))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mysql_async::ServerError;

    fn server(code: u16) -> MyError {
        MyError::Server(ServerError {
            code,
            message: format!("error {code}"),
            state: "HY000".into(),
        })
    }

    fn io() -> MyError {
        MyError::Io(mysql_async::IoError::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        )))
    }

    #[test]
    fn deadlocks_and_lock_wait_timeouts_are_retried() {
        for code in [1213, 1205, 1020] {
            for phase in [Phase::Statement, Phase::Commit] {
                assert!(matches!(classify(&server(code), phase), TxError::Retry(_)), "{code}");
            }
        }
    }

    #[test]
    fn a_lost_connection_is_retried_before_commit_and_ambiguous_during_it() {
        for e in [
            io(),
            server(1927),
            MyError::Driver(DriverError::ConnectionClosed),
            // A Galera node that is not in the primary component.
            server(1047),
            server(1180),
        ] {
            assert!(matches!(classify(&e, Phase::Statement), TxError::Retry(_)));
            assert!(matches!(classify(&e, Phase::Commit), TxError::Ambiguous(_)));
            assert!(matches!(
                classify(&e, Phase::Connect),
                TxError::Ledger(LedgerError::Unavailable(_))
            ));
        }
    }

    #[test]
    fn other_errors_are_final() {
        assert!(matches!(
            classify(&server(1045), Phase::Connect),
            TxError::Ledger(LedgerError::Unavailable(_))
        ));
        assert!(matches!(
            classify(&server(1146), Phase::Statement),
            TxError::Ledger(LedgerError::Internal(m)) if m.contains("leasehold migrate")
        ));
        assert!(matches!(
            classify(&server(1062), Phase::Statement),
            TxError::Ledger(LedgerError::Internal(_))
        ));
    }
}
