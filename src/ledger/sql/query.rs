//! The statements every SQL ledger runs alike, written once per dialect (and built
//! once per process): plan reads and writes, an attempt's rows, a plan's history,
//! the inserts of a new attempt, the count of open attempts.
//!
//! Parameters are in the order their doc gives. Reads that a transition takes in
//! lock order come in a `_locked` form: `FOR UPDATE` where the dialect locks rows,
//! the same text where it does not (SQLite's write transaction holds the database).

use super::table::{Table, ATTEMPT, COMMAND, PLAN, RECEIPT};
use super::{placeholders, Dialect, Value, MYSQL, POSTGRES, SQLITE, SQLITE_WITHOUT_ROOM};
use leasehold_engine::{AttemptStatus, Exhaustion, PlanId};
use std::sync::LazyLock;

/// The shared statements of one dialect.
#[derive(Debug)]
pub(crate) struct Queries {
    /// A plan by id (`id`).
    pub(crate) plan_by_id: String,
    /// [`Queries::plan_by_id`], locked.
    pub(crate) plan_by_id_locked: String,
    /// The oldest READY plan with a fingerprint (`fingerprint`), locked: where there
    /// is none, a row-locking dialect holds the index gap, so a concurrent
    /// registration of the same content waits instead of inserting a duplicate.
    pub(crate) ready_plan_by_fingerprint_locked: String,
    /// Every plan, in registration order.
    pub(crate) plans: String,
    /// The plans with a name (`name`), in registration order (the `plan_by_name` index).
    pub(crate) plans_named: String,
    /// The newest plans (`limit`), newest first.
    pub(crate) plans_newest: String,
    /// The newest plans registered before a plan (`id`, `limit`), newest first.
    pub(crate) plans_newest_before: String,
    /// Inserts a plan ([`super::table::plan_values`]).
    pub(crate) insert_plan: String,
    /// Sets a plan's status (`status`, `id`).
    pub(crate) set_plan_status: String,
    /// Writes a plan's row as it is, locking it and (on PostgreSQL) giving it a new
    /// version (`id`): what ends the head of an order key does first.
    pub(crate) touch_plan: String,
    /// Stores a plan's step targets where none are (`targets_json`, `id`).
    pub(crate) fill_plan_targets: String,
    /// An attempt by id (`id`).
    pub(crate) attempt_by_id: String,
    /// [`Queries::attempt_by_id`], locked.
    pub(crate) attempt_by_id_locked: String,
    /// The id of the attempt an enqueue key names (`enqueue_key`).
    pub(crate) attempt_by_enqueue_key: String,
    /// The id of a plan's highest-numbered attempt (`plan_id`).
    pub(crate) latest_attempt_of_plan: String,
    /// The id of the newest open attempt of a plan with an order key (`plan_id`,
    /// `order_key`).
    pub(crate) open_on_order_key: String,
    /// The ids of the attempts of a plan with an order key whose command is
    /// WAITING, by number, locked (`plan_id`, `order_key`).
    pub(crate) waiting_on_order_key: String,
    /// An attempt's command (`attempt_id`).
    pub(crate) command_of_attempt: String,
    /// An attempt's receipts by ordinal (`attempt_id`).
    pub(crate) receipts_of_attempt: String,
    /// [`Queries::receipts_of_attempt`], locked.
    pub(crate) receipts_of_attempt_locked: String,
    /// A plan's attempts by number (`plan_id`).
    pub(crate) history_attempts: String,
    /// The commands of a plan's attempts (`plan_id`).
    pub(crate) history_commands: String,
    /// The receipts of a plan's attempts, by attempt then ordinal (`plan_id`).
    pub(crate) history_receipts: String,
    /// Inserts an attempt ([`super::table::attempt_values`]).
    pub(crate) insert_attempt: String,
    /// Inserts a command ([`super::table::command_values`]); where the dialect has
    /// one, its conflict clause makes an existing command insert nothing.
    pub(crate) insert_command: String,
    /// Inserts a receipt ([`super::table::receipt_values`]).
    pub(crate) insert_receipt: String,
    /// How many attempts are open (QUEUED or RUNNING), counted by their commands:
    /// an attempt is open exactly while its one command is PENDING or PROCESSING
    /// (every transition writes the two together: the transition table of docs/design.md), and
    /// the claims' indexes already hold those commands, so no index of attempts by
    /// status has to follow every claim and every finish. One integer column.
    pub(crate) open_attempts: String,
    /// The console's count of the attempts in each state, stopped at a cap (`limit`),
    /// in the order of [`AttemptStatus::ALL`]: QUEUED and RUNNING by their commands
    /// ([`open_command_status`]), as [`Queries::open_attempts`] counts them, from the
    /// claims' indexes; the ended states by the attempt's own status. One integer
    /// column.
    capped_counts: Vec<String>,
    /// How many attempts ended exhausted (FAILED, their error starting with
    /// `exhausted:`), up to `$1`. One integer column.
    pub(crate) capped_exhausted: String,
    /// The earliest `available_at` of a PENDING command (the claims' pending index),
    /// NULL when there is none. One integer column.
    pub(crate) oldest_pending: String,
    /// The earliest `lease_until` of a PROCESSING command (the leased index), NULL
    /// when there is none. One integer column.
    pub(crate) oldest_lease: String,
}

impl Queries {
    /// [`Queries::capped_counts`] of `status`.
    pub(crate) fn capped_count(&self, status: AttemptStatus) -> &str {
        let i = AttemptStatus::ALL.iter().position(|s| *s == status).unwrap_or(0);
        &self.capped_counts[i]
    }
}

/// The statuses of an open attempt's command, as an SQL list: PENDING or WAITING
/// (behind an order key) while it is QUEUED, PROCESSING while it is RUNNING (every
/// transition writes the two together); `None` for an ended attempt.
fn open_command_status(status: AttemptStatus) -> Option<&'static str> {
    match status {
        AttemptStatus::Queued => Some("'PENDING', 'WAITING'"),
        AttemptStatus::Running => Some("'PROCESSING'"),
        _ => None,
    }
}

/// The shared statements of `dialect`.
pub(crate) fn queries(dialect: &'static Dialect) -> &'static Queries {
    static BY_DIALECT: [LazyLock<Queries>; 4] = [
        LazyLock::new(|| build(&SQLITE)),
        LazyLock::new(|| build(&MYSQL)),
        LazyLock::new(|| build(&POSTGRES)),
        LazyLock::new(|| build(&SQLITE_WITHOUT_ROOM)),
    ];
    &BY_DIALECT[usize::from(dialect.id)]
}

/// A page of plans, newest first: [`Queries::plans_newest`], or
/// [`Queries::plans_newest_before`] the plan `before`, with their values.
pub(crate) fn plans_page<'a>(
    d: &'static Dialect,
    before: Option<&'a PlanId>,
    limit: u32,
) -> (&'static str, Vec<Value<'a>>) {
    let q = queries(d);
    let limit = Value::Int(i64::from(limit));
    match before {
        None => (&q.plans_newest, vec![limit]),
        Some(id) => (&q.plans_newest_before, vec![Value::Text(id.as_str()), limit]),
    }
}

/// `INSERT INTO table (columns) VALUES (…)`, with the row's room last where the
/// dialect keeps it (bound after the columns: [`super::write::room`]).
fn insert(d: &Dialect, table: &Table, tail: &str) -> String {
    let n = table.columns.len();
    let (room_column, room_value) = if d.room && table.reserve > 0 {
        (
            ", room".to_owned(),
            format!(", zeroblob({})", placeholders(d, n + 1, 1)),
        )
    } else {
        (String::new(), String::new())
    };
    let mut sql = format!(
        "INSERT INTO {} ({}{room_column}) VALUES ({}{room_value})",
        table.name,
        table.column_list(None),
        placeholders(d, 1, n)
    );
    if !tail.is_empty() {
        sql.push(' ');
        sql.push_str(tail);
    }
    sql
}

fn build(d: &'static Dialect) -> Queries {
    let p1 = placeholders(d, 1, 1);
    let p2 = placeholders(d, 2, 1);
    let lock = d.for_update();
    let plan = PLAN.column_list(None);
    let attempt = ATTEMPT.column_list(None);
    let command = COMMAND.column_list(None);
    let receipt = RECEIPT.column_list(None);
    let order = d.plan_order;
    let plan_by_id = format!("SELECT {plan} FROM plan WHERE id = {p1}");
    let attempt_by_id = format!("SELECT {attempt} FROM attempt WHERE id = {p1}");
    let receipts_of_attempt = format!("SELECT {receipt} FROM receipt WHERE attempt_id = {p1} ORDER BY ordinal");
    Queries {
        plan_by_id_locked: format!("{plan_by_id}{lock}"),
        plan_by_id,
        ready_plan_by_fingerprint_locked: format!(
            "SELECT {plan} FROM plan WHERE fingerprint = {p1} AND status = 'READY' ORDER BY {order} LIMIT 1{lock}"
        ),
        plans: format!("SELECT {plan} FROM plan ORDER BY {order}"),
        plans_named: format!("SELECT {plan} FROM plan WHERE name = {p1} ORDER BY {order}"),
        plans_newest: format!("SELECT {plan} FROM plan ORDER BY {order} DESC LIMIT {p1}"),
        plans_newest_before: format!(
            "SELECT {plan} FROM plan WHERE {order} < (SELECT {order} FROM plan WHERE id = {p1}) \
             ORDER BY {order} DESC LIMIT {p2}"
        ),
        insert_plan: insert(d, &PLAN, ""),
        set_plan_status: format!("UPDATE plan SET status = {p1} WHERE id = {p2}"),
        touch_plan: format!("UPDATE plan SET status = status WHERE id = {p1}"),
        fill_plan_targets: format!("UPDATE plan SET targets_json = {p1} WHERE id = {p2} AND targets_json IS NULL"),
        attempt_by_id_locked: format!("{attempt_by_id}{lock}"),
        attempt_by_id,
        attempt_by_enqueue_key: format!("SELECT id FROM attempt WHERE enqueue_key = {p1}"),
        latest_attempt_of_plan: format!("SELECT id FROM attempt WHERE plan_id = {p1} ORDER BY number DESC LIMIT 1"),
        open_on_order_key: format!(
            "SELECT id FROM attempt WHERE plan_id = {p1} AND order_key = {p2} AND status IN ('QUEUED', 'RUNNING') \
             ORDER BY number DESC LIMIT 1"
        ),
        waiting_on_order_key: format!(
            "SELECT a.id FROM attempt a JOIN command c ON c.attempt_id = a.id \
             WHERE a.plan_id = {p1} AND a.order_key = {p2} AND c.status = 'WAITING' ORDER BY a.number{lock}"
        ),
        command_of_attempt: format!("SELECT {command} FROM command WHERE attempt_id = {p1}"),
        receipts_of_attempt_locked: format!("{receipts_of_attempt}{lock}"),
        receipts_of_attempt,
        history_attempts: format!("SELECT {attempt} FROM attempt WHERE plan_id = {p1} ORDER BY number"),
        history_commands: format!(
            "SELECT {} FROM command c JOIN attempt a ON a.id = c.attempt_id WHERE a.plan_id = {p1}",
            COMMAND.column_list(Some("c"))
        ),
        history_receipts: format!(
            "SELECT {} FROM receipt r JOIN attempt a ON a.id = r.attempt_id WHERE a.plan_id = {p1} \
             ORDER BY r.attempt_id, r.ordinal",
            RECEIPT.column_list(Some("r"))
        ),
        insert_attempt: insert(d, &ATTEMPT, ""),
        insert_command: insert(d, &COMMAND, d.insert_or_nothing.unwrap_or("")),
        insert_receipt: insert(d, &RECEIPT, ""),
        // Two counts, one per arm: each is the range of one index (SQLite's and
        // PostgreSQL's partial indexes hold one status each).
        open_attempts: "SELECT (SELECT COUNT(*) FROM command WHERE status = 'PENDING') \
                        + (SELECT COUNT(*) FROM command WHERE status = 'PROCESSING') \
                        + (SELECT COUNT(*) FROM command WHERE status = 'WAITING')"
            .to_owned(),
        capped_counts: AttemptStatus::ALL
            .iter()
            .map(|&s| {
                let (table, statuses) = match open_command_status(s) {
                    Some(command) => ("command", command.to_owned()),
                    None => ("attempt", format!("'{}'", s.as_str())),
                };
                format!("SELECT COUNT(*) FROM (SELECT 1 FROM {table} WHERE status IN ({statuses}) LIMIT {p1}) t")
            })
            .collect(),
        capped_exhausted: format!(
            "SELECT COUNT(*) FROM (SELECT 1 FROM attempt WHERE status = 'FAILED' AND error LIKE '{}%' LIMIT {p1}) t",
            Exhaustion::PREFIX
        ),
        oldest_pending: "SELECT MIN(available_at) FROM command WHERE status = 'PENDING'".to_owned(),
        oldest_lease: "SELECT MIN(lease_until) FROM command WHERE status = 'PROCESSING'".to_owned(),
    }
}
