//! The SQL layer the SQL ledgers share: one description of the tables, one row
//! encoding and decoding, one rendering of the engine's [`leasehold_engine::Guard`]
//! as a `WHERE` condition, one claim rule and one plan of the statements that apply a
//! transition's [`leasehold_engine::Writes`] — each parameterised by a [`Dialect`].
//!
//! Dialects: [`SQLITE`] (and [`SQLITE_WITHOUT_ROOM`] for a ledger not yet migrated), [`MYSQL`]
//! and [`POSTGRES`].
//!
//! Contract:
//! - [`table`] lists every column of `plan`, `attempt`, `command` and `receipt` once,
//!   in the order of the `*_values` encoders and of the [`decode`] readers, with the
//!   columns a transition may change (the rest is identity and never rewritten).
//! - [`decode`] reads rows strictly over any [`decode::ColumnReader`]: a status the
//!   engine does not know, a NULL where a value belongs or a negative count is
//!   [`super::LedgerError::Integrity`], naming the table and column, never the value.
//! - [`write`] renders guards and plans writes: the command's statement carries the
//!   guard, goes first, and matching no row is [`leasehold_engine::Refusal::StaleToken`]
//!   with nothing written by it. Lease tokens are only ever bound as parameters.
//! - [`ready`] lists the probes that say whether a ledger can serve (its schema's
//!   version, every table and column it reads), and says what is missing.
//! - A backend supplies the execution (a connection, a transaction, its driver's
//!   value type) and the SQL text that is its own (how it locks, how it claims in
//!   bulk): nothing else.

pub(crate) mod batch;
pub(crate) mod decode;
pub(crate) mod fleet;
pub(crate) mod group;
pub(crate) mod ledger;
pub(crate) mod limits;
pub(crate) mod listing;
pub(crate) mod order;
pub(crate) mod prune;
pub(crate) mod query;
pub(crate) mod ready;
pub(crate) mod session;
pub(crate) mod slots;
pub(crate) mod table;
pub(crate) mod write;

#[cfg(any(feature = "mysql", feature = "postgres"))]
pub use ledger::SqlLedger;

#[cfg(test)]
pub(crate) mod tests;

/// What went wrong in one try of a SQL backend's transaction.
#[derive(Debug)]
pub(crate) enum TxError {
    /// Nothing was committed; trying the whole transaction again may succeed.
    Retry(String),
    /// The connection was lost during `COMMIT`: the outcome is unknown.
    Ambiguous(String),
    /// A final answer.
    Ledger(super::LedgerError),
}

impl From<super::LedgerError> for TxError {
    fn from(e: super::LedgerError) -> Self {
        TxError::Ledger(e)
    }
}

impl From<leasehold_engine::Refusal> for TxError {
    fn from(r: leasehold_engine::Refusal) -> Self {
        TxError::Ledger(super::LedgerError::Refused(r))
    }
}

impl From<TxError> for super::LedgerError {
    /// The final answer once retries are used up: a retryable error is "unavailable".
    fn from(e: TxError) -> Self {
        match e {
            TxError::Retry(m) => super::LedgerError::Unavailable(m),
            TxError::Ambiguous(m) => super::LedgerError::Ambiguous(m),
            TxError::Ledger(e) => e,
        }
    }
}

/// How a dialect spells a statement's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placeholder {
    /// `?1`, `?2`, … (SQLite).
    Numbered,
    /// `?` each, bound in order (MySQL).
    Anonymous,
    /// `$1`, `$2`, … (PostgreSQL).
    Dollar,
}

/// What differs between SQL backends in the statements this layer writes. Kept small
/// on purpose: anything else a backend does differently is its own SQL text.
#[derive(Debug)]
pub(crate) struct Dialect {
    /// Which dialect (part of a cached statement's key).
    pub(crate) id: u8,
    /// How parameters are written.
    pub(crate) placeholder: Placeholder,
    /// Whether `SELECT … FOR UPDATE SKIP LOCKED` exists (row locks); SQLite locks the
    /// whole database per write transaction and has neither.
    pub(crate) row_locks: bool,
    /// The null-safe equality operator (`IS`, `<=>`, `IS NOT DISTINCT FROM`).
    pub(crate) null_safe_eq: &'static str,
    /// The clause that makes an `INSERT` of an existing key insert nothing (and
    /// answer zero rows); `None` where a duplicate key is an error the backend maps.
    pub(crate) insert_or_nothing: Option<&'static str>,
    /// The database clock's now in milliseconds since the Unix epoch, as an expression.
    pub(crate) now_ms: &'static str,
    /// Whether row values compare (`(a, b) < (x, y)`) along an index: a listing's
    /// page after a key uses them where they do, and the spelled-out `OR` elsewhere.
    pub(crate) row_compare: bool,
    /// The column that orders plans by registration.
    pub(crate) plan_order: &'static str,
    /// Whether the attempt, command and receipt rows keep zero bytes for their
    /// mutable columns to grow into (a `room` column, see [`write::room`]): SQLite
    /// packs rows appended in key order into full pages, so a row that grows in place
    /// would split its page; the others leave free space in their pages themselves.
    pub(crate) room: bool,
    /// Type names for a 64-bit integer and for text (scratch tables in tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) types: (&'static str, &'static str),
}

/// SQLite, on a schema whose rows keep room (version 6 on).
pub(crate) static SQLITE: Dialect = SQLITE_DIALECT;

/// SQLite on a ledger not yet migrated to version 6, whose tables have no `room`
/// column: the same statements without it.
pub(crate) static SQLITE_WITHOUT_ROOM: Dialect = Dialect {
    id: 3,
    room: false,
    ..SQLITE_DIALECT
};

const SQLITE_DIALECT: Dialect = Dialect {
    id: 0,
    placeholder: Placeholder::Numbered,
    row_locks: false,
    null_safe_eq: "IS",
    insert_or_nothing: Some("ON CONFLICT DO NOTHING"),
    now_ms: "CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)",
    row_compare: true,
    plan_order: "rowid",
    room: true,
    types: ("INTEGER", "TEXT"),
};

/// MySQL 8 and MariaDB 10.6+. Sessions run with `time_zone = '+00:00'`, so the
/// clock expression is exact.
pub(crate) static MYSQL: Dialect = Dialect {
    id: 1,
    placeholder: Placeholder::Anonymous,
    row_locks: true,
    null_safe_eq: "<=>",
    insert_or_nothing: None,
    now_ms: "CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000) AS SIGNED)",
    row_compare: false,
    plan_order: "seq",
    room: false,
    types: ("BIGINT", "VARCHAR(255)"),
};

/// PostgreSQL 13+. Every text column uses the "C" collation, so comparisons and
/// orders are byte-wise, as in the other two.
pub(crate) static POSTGRES: Dialect = Dialect {
    id: 2,
    placeholder: Placeholder::Dollar,
    row_locks: true,
    null_safe_eq: "IS NOT DISTINCT FROM",
    insert_or_nothing: Some("ON CONFLICT DO NOTHING"),
    now_ms: "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
    row_compare: true,
    plan_order: "seq",
    room: false,
    types: ("BIGINT", "TEXT"),
};

impl Dialect {
    /// A shared row lock where reads lock rows (` FOR SHARE`, MySQL's ` LOCK IN SHARE
    /// MODE`), else nothing.
    pub(crate) fn for_share(&self) -> &'static str {
        match (self.row_locks, self.id) {
            (false, _) => "",
            (true, 1) => " LOCK IN SHARE MODE",
            (true, _) => " FOR SHARE",
        }
    }

    /// ` FOR UPDATE` where reads lock rows, else nothing.
    pub(crate) fn for_update(&self) -> &'static str {
        if self.row_locks {
            " FOR UPDATE"
        } else {
            ""
        }
    }
}

/// A value to bind, borrowed from the row image or argument it comes from. It has no
/// `Debug`: it may be a lease token.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Value<'a> {
    /// SQL `NULL`.
    Null,
    /// An integer (timestamps in milliseconds, counts, ordinals).
    Int(i64),
    /// Text (ids, statuses, JSON, tokens).
    Text(&'a str),
}

impl<'a> Value<'a> {
    /// Text, or `NULL`.
    pub(crate) fn opt_text(s: Option<&'a str>) -> Self {
        s.map_or(Value::Null, Value::Text)
    }

    /// A timestamp in milliseconds.
    pub(crate) fn ts(t: leasehold_engine::Timestamp) -> Self {
        Value::Int(t.as_millis())
    }

    /// A timestamp, or `NULL`.
    pub(crate) fn opt_ts(t: Option<leasehold_engine::Timestamp>) -> Self {
        t.map_or(Value::Null, Value::ts)
    }
}

/// A statement's text and its parameters, built side by side so that every
/// placeholder gets its value in order.
pub(crate) struct Sql<'a> {
    dialect: &'static Dialect,
    /// The text so far.
    pub(crate) text: String,
    /// The parameters so far, in placeholder order.
    pub(crate) values: Vec<Value<'a>>,
}

impl<'a> Sql<'a> {
    /// An empty statement in `dialect`.
    pub(crate) fn new(dialect: &'static Dialect) -> Self {
        Self {
            dialect,
            text: String::new(),
            values: Vec::new(),
        }
    }

    /// Appends text.
    pub(crate) fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// Appends a placeholder bound to `value`.
    pub(crate) fn bind(&mut self, value: Value<'a>) -> &mut Self {
        self.values.push(value);
        push_placeholder(self.dialect, &mut self.text, self.values.len());
        self
    }
}

/// Appends the `n`th (from 1) placeholder of `dialect`.
pub(crate) fn push_placeholder(dialect: &Dialect, text: &mut String, n: usize) {
    use std::fmt::Write as _;
    match dialect.placeholder {
        Placeholder::Numbered => {
            let _ = write!(text, "?{n}");
        }
        Placeholder::Anonymous => text.push('?'),
        Placeholder::Dollar => {
            let _ = write!(text, "${n}");
        }
    }
}

/// `n` placeholders from `first`, comma-separated.
pub(crate) fn placeholders(dialect: &Dialect, first: usize, n: usize) -> String {
    let mut text = String::new();
    for k in 0..n {
        if k > 0 {
            text.push_str(", ");
        }
        push_placeholder(dialect, &mut text, first + k);
    }
    text
}

/// Polls `future` once with a no-op waker: the answer of a future that never waits
/// (a synchronous session's, SQLite's), or `None` if it would have waited.
pub(crate) fn poll_now<F: std::future::Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}
