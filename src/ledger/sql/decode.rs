//! Rows → engine model, strictly, over any driver's row ([`ColumnReader`]).
//!
//! Every reader reads the columns of [`super::table`] in their order, starting at a
//! `base` column (a join puts several tables side by side). Anything the engine
//! would not accept is [`LedgerError::Integrity`] naming the table and the column;
//! a value is never echoed (it could be a lease token).

use super::table::{Table, ATTEMPT, COMMAND, PLAN, RECEIPT};
use crate::ledger::listing::{tolerate, DamagedRow, PageKey};
use crate::ledger::LedgerError;
use leasehold_engine::{
    Attempt, AttemptId, AttemptRecord, Command, CommandId, LeaseToken, Plan, PlanId, Receipt, Step, Timestamp,
};
use std::collections::BTreeMap;
use std::str::FromStr;

/// Joins claimed candidates (their attempt and command rows, in claim order) with
/// their receipts and plans as read in bulk: one record with its plan per candidate,
/// in order. A candidate whose plan is missing is [`LedgerError::Integrity`].
pub(crate) fn claimed_records(
    heads: Vec<(Attempt, Command)>,
    mut receipts: BTreeMap<AttemptId, Vec<Receipt>>,
    plans: &BTreeMap<PlanId, Plan>,
) -> Result<Vec<(AttemptRecord, Plan)>, LedgerError> {
    heads
        .into_iter()
        .map(|(attempt, command)| {
            let plan = plans.get(&attempt.plan_id).cloned().ok_or_else(|| {
                LedgerError::Integrity(format!(
                    "attempt {} names a missing plan {}",
                    attempt.id, attempt.plan_id
                ))
            })?;
            let record = AttemptRecord {
                receipts: receipts.remove(&attempt.id).unwrap_or_default(),
                attempt,
                command,
            };
            Ok((record, plan))
        })
        .collect()
}

/// One row of a driver's result, read a column at a time. An `Err` says what is
/// wrong with the column (its type, its absence), never what it holds.
pub(crate) trait ColumnReader {
    /// Column `idx` as an integer; `None` for NULL.
    fn int(&mut self, idx: usize) -> Result<Option<i64>, String>;
    /// Column `idx` as text; `None` for NULL.
    fn text(&mut self, idx: usize) -> Result<Option<String>, String>;
    /// Whether column `idx` is NULL (without consuming it).
    fn is_null(&mut self, idx: usize) -> Result<bool, String>;
}

/// Strict readers of one table's columns within a row.
pub(crate) struct Columns<'r, R: ?Sized> {
    row: &'r mut R,
    table: &'static Table,
    base: usize,
}

impl<'r, R: ColumnReader + ?Sized> Columns<'r, R> {
    /// The columns of `table`, starting at column `base` of `row`.
    pub(crate) fn new(row: &'r mut R, table: &'static Table, base: usize) -> Self {
        Self { row, table, base }
    }

    fn error(&self, idx: usize, what: impl std::fmt::Display) -> LedgerError {
        let column = self.table.columns.get(idx).copied().unwrap_or("?");
        LedgerError::Integrity(format!("{} row: column {column}: {what}", self.table.name))
    }

    fn opt_int(&mut self, idx: usize) -> Result<Option<i64>, LedgerError> {
        self.row.int(self.base + idx).map_err(|e| self.error(idx, e))
    }

    fn opt_string(&mut self, idx: usize) -> Result<Option<String>, LedgerError> {
        self.row.text(self.base + idx).map_err(|e| self.error(idx, e))
    }

    fn int(&mut self, idx: usize) -> Result<i64, LedgerError> {
        self.opt_int(idx)?.ok_or_else(|| self.error(idx, "is NULL"))
    }

    fn string(&mut self, idx: usize) -> Result<String, LedgerError> {
        self.opt_string(idx)?.ok_or_else(|| self.error(idx, "is NULL"))
    }

    /// Whether the table's first column (its key) is not NULL: a `LEFT JOIN` found a row.
    pub(crate) fn present(&mut self) -> Result<bool, LedgerError> {
        Ok(!self.row.is_null(self.base).map_err(|e| self.error(0, e))?)
    }

    fn text_enum<T: FromStr>(&mut self, idx: usize) -> Result<T, LedgerError>
    where
        T::Err: std::fmt::Display,
    {
        let text = self.string(idx)?;
        text.parse().map_err(|e| self.error(idx, e))
    }

    fn timestamp(&mut self, idx: usize) -> Result<Timestamp, LedgerError> {
        self.int(idx).map(Timestamp::from_millis)
    }

    fn opt_timestamp(&mut self, idx: usize) -> Result<Option<Timestamp>, LedgerError> {
        Ok(self.opt_int(idx)?.map(Timestamp::from_millis))
    }

    fn count(&mut self, idx: usize) -> Result<u32, LedgerError> {
        let n = self.int(idx)?;
        u32::try_from(n).map_err(|_| self.error(idx, format!("{n} is not a valid count")))
    }

    fn json<T: serde::de::DeserializeOwned>(&mut self, idx: usize) -> Result<T, LedgerError> {
        let text = self.string(idx)?;
        serde_json::from_str(&text).map_err(|e| self.error(idx, format!("bad JSON: {e}")))
    }

    fn opt_text_enum<T: FromStr>(&mut self, idx: usize) -> Result<Option<T>, LedgerError>
    where
        T::Err: std::fmt::Display,
    {
        match self.opt_string(idx)? {
            None => Ok(None),
            Some(text) => text.parse().map(Some).map_err(|e| self.error(idx, e)),
        }
    }

    fn opt_json<T: serde::de::DeserializeOwned>(&mut self, idx: usize) -> Result<Option<T>, LedgerError> {
        match self.opt_string(idx)? {
            None => Ok(None),
            Some(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| self.error(idx, format!("bad JSON: {e}"))),
        }
    }
}

/// The plan whose columns start at column `base`.
pub(crate) fn plan<R: ColumnReader + ?Sized>(row: &mut R, base: usize) -> Result<Plan, LedgerError> {
    let id = Columns::new(row, &PLAN, base).string(0)?;
    plan_with_id(row, base, id)
}

/// A plan row of a listing: the plan, or the row marked damaged (with its id when
/// that reads) when its data does not parse ([`tolerate`]).
pub(crate) fn listed_plan<R: ColumnReader + ?Sized>(row: &mut R) -> Result<Result<Plan, DamagedRow>, LedgerError> {
    // The id is read once (a driver's row may give each column only once).
    let id = match Columns::new(row, &PLAN, 0).string(0) {
        Ok(id) => id,
        Err(e) => return tolerate(None, Err(e)),
    };
    let plan = plan_with_id(row, 0, id.clone());
    tolerate(Some(&id), plan)
}

/// The plan whose columns start at column `base`, its id already read as `id`.
fn plan_with_id<R: ColumnReader + ?Sized>(row: &mut R, base: usize, id: String) -> Result<Plan, LedgerError> {
    let mut c = Columns::new(row, &PLAN, base);
    Ok(Plan {
        id: PlanId::new(id),
        name: c.string(1)?,
        status: c.text_enum(2)?,
        recovery: c.text_enum(3)?,
        steps: c.json::<Vec<Step>>(4)?,
        volatile_fields: c.json::<Vec<String>>(5)?,
        queue: c.opt_string(9)?,
        fingerprint: c.string(6)?,
        created_at: c.timestamp(7)?,
        retry: c.opt_json(8)?,
        input: c.opt_json(10)?,
        on_failure: c.opt_text_enum(11)?,
    })
}

/// The attempt whose columns start at column `base`.
pub(crate) fn attempt<R: ColumnReader + ?Sized>(row: &mut R, base: usize) -> Result<Attempt, LedgerError> {
    let mut c = Columns::new(row, &ATTEMPT, base);
    Ok(Attempt {
        id: AttemptId::new(c.string(0)?),
        plan_id: PlanId::new(c.string(1)?),
        number: c.count(2)?,
        action: c.text_enum(3)?,
        status: c.text_enum(4)?,
        created_at: c.timestamp(5)?,
        started_at: c.opt_timestamp(6)?,
        finished_at: c.opt_timestamp(7)?,
        error: c.opt_string(8)?,
        trace: c.opt_text_enum(9)?,
        enqueue_key: c.opt_string(10)?,
        request_sha256: c.opt_string(11)?,
        input: c.opt_string(12)?,
        input_sha256: c.opt_string(13)?,
        order_key: c.opt_string(14)?,
    })
}

/// The command whose columns start at column `base`.
pub(crate) fn command<R: ColumnReader + ?Sized>(row: &mut R, base: usize) -> Result<Command, LedgerError> {
    let mut c = Columns::new(row, &COMMAND, base);
    Ok(Command {
        id: CommandId::new(c.string(0)?),
        attempt_id: AttemptId::new(c.string(1)?),
        status: c.text_enum(2)?,
        available_at: c.timestamp(3)?,
        lease_owner: c.opt_string(4)?,
        lease_token: c.opt_string(5)?.map(LeaseToken::new),
        lease_until: c.opt_timestamp(6)?,
        last_heartbeat_at: c.opt_timestamp(7)?,
        delivery_count: c.count(8)?,
        last_error: c.opt_string(9)?,
        finished_at: c.opt_timestamp(10)?,
        queue: c.string(11)?,
        executor: c.string(12)?,
        target: c.string(13)?,
    })
}

/// The receipt whose columns start at column `base`.
pub(crate) fn receipt<R: ColumnReader + ?Sized>(row: &mut R, base: usize) -> Result<Receipt, LedgerError> {
    let mut c = Columns::new(row, &RECEIPT, base);
    Ok(Receipt {
        attempt_id: AttemptId::new(c.string(0)?),
        ordinal: c.count(1)?,
        step_code: c.string(2)?,
        idempotency_key: c.string(3)?,
        executor: c.string(11)?,
        target: c.string(12)?,
        payload: c.opt_string(13)?,
        status: c.text_enum(4)?,
        evidence: c.opt_string(5)?,
        evidence_sha256: c.opt_string(6)?,
        target_receipt: c.opt_string(7)?,
        error: c.opt_string(8)?,
        started_at: c.opt_timestamp(9)?,
        finished_at: c.opt_timestamp(10)?,
    })
}

/// The command of a `LEFT JOIN command` row whose columns start at `base`, if the
/// join found one.
pub(crate) fn command_if_any<R: ColumnReader + ?Sized>(
    row: &mut R,
    base: usize,
) -> Result<Option<Command>, LedgerError> {
    if Columns::new(row, &COMMAND, base).present()? {
        command(row, base).map(Some)
    } else {
        Ok(None)
    }
}

/// The receipt of a `LEFT JOIN receipt` row whose columns start at `base`, if the
/// join found one.
pub(crate) fn receipt_if_any<R: ColumnReader + ?Sized>(
    row: &mut R,
    base: usize,
) -> Result<Option<Receipt>, LedgerError> {
    if Columns::new(row, &RECEIPT, base).present()? {
        receipt(row, base).map(Some)
    } else {
        Ok(None)
    }
}

/// An integer result column (a count, a flag) of a row that is not a table's.
pub(crate) fn scalar<R: ColumnReader + ?Sized>(row: &mut R, idx: usize, what: &str) -> Result<i64, LedgerError> {
    row.int(idx)
        .map_err(|e| LedgerError::Integrity(format!("{what}: {e}")))?
        .ok_or_else(|| LedgerError::Integrity(format!("{what}: is NULL")))
}

/// An integer result column that may be NULL (an aggregate over no rows).
pub(crate) fn opt_scalar<R: ColumnReader + ?Sized>(
    row: &mut R,
    idx: usize,
    what: &str,
) -> Result<Option<i64>, LedgerError> {
    row.int(idx).map_err(|e| LedgerError::Integrity(format!("{what}: {e}")))
}

/// A text result column (an id) of a row that is not a table's.
pub(crate) fn string<R: ColumnReader + ?Sized>(row: &mut R, idx: usize, what: &str) -> Result<String, LedgerError> {
    row.text(idx)
        .map_err(|e| LedgerError::Integrity(format!("{what}: {e}")))?
        .ok_or_else(|| LedgerError::Integrity(format!("{what}: is NULL")))
}

/// A listing's key row (`SELECT id, created_at FROM attempt …`), each column as far
/// as it reads: a key that does not read is a damaged row, not a failed page.
pub(crate) fn page_key<R: ColumnReader + ?Sized>(row: &mut R) -> PageKey {
    let id = string(row, 0, "attempt row: column id");
    let created_at = scalar(row, 1, "attempt row: column created_at");
    PageKey::new(id, created_at)
}

/// A command id in result column `idx` (a guard check's first column).
pub(crate) fn command_id<R: ColumnReader + ?Sized>(row: &mut R, idx: usize) -> Result<CommandId, LedgerError> {
    string(row, idx, "command id").map(CommandId::new)
}

/// A guard check's row ([`super::write::guard_check`]): the command's id, and
/// whether the guard holds.
pub(crate) fn guard_check<R: ColumnReader + ?Sized>(row: &mut R) -> Result<(CommandId, bool), LedgerError> {
    Ok((command_id(row, 0)?, scalar(row, 1, "guard check")? != 0))
}

/// "attempt … has no command".
pub(crate) fn no_command(attempt: &AttemptId) -> LedgerError {
    LedgerError::Integrity(format!("attempt {attempt} has no command"))
}

/// Puts a plan's history together from its three reads: attempts by number, their
/// commands (any order) and their receipts (by attempt, then ordinal). An attempt
/// without a command is an integrity error.
pub(crate) fn history(
    attempts: Vec<Attempt>,
    commands: Vec<Command>,
    receipts: Vec<Receipt>,
) -> Result<Vec<AttemptRecord>, LedgerError> {
    let mut commands: BTreeMap<AttemptId, Command> = commands.into_iter().map(|c| (c.attempt_id.clone(), c)).collect();
    let mut by_attempt: BTreeMap<AttemptId, Vec<Receipt>> = BTreeMap::new();
    for r in receipts {
        by_attempt.entry(r.attempt_id.clone()).or_default().push(r);
    }
    attempts
        .into_iter()
        .map(|attempt| {
            let command = commands.remove(&attempt.id).ok_or_else(|| no_command(&attempt.id))?;
            let receipts = by_attempt.remove(&attempt.id).unwrap_or_default();
            Ok(AttemptRecord {
                attempt,
                command,
                receipts,
            })
        })
        .collect()
}
