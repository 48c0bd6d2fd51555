//! The two interpreters of a guard agree: [`Guard::admits`] on a command row, and the
//! rendered `WHERE` condition (and guard check) on the same row stored in a real
//! database — SQLite always, MySQL/MariaDB when `LEASEHOLD_TEST_MYSQL_URL` is set,
//! PostgreSQL when `LEASEHOLD_TEST_POSTGRES_URL` is set.

use super::table::{command_values, COMMAND};
use super::write::{guard_check, guard_condition};
use super::{Dialect, Value, MYSQL, POSTGRES, SQLITE};
use leasehold_engine::{AttemptId, Command, CommandId, CommandStatus, Guard, LeaseToken, Timestamp};
use proptest::prelude::*;

/// The command columns that hold integers; the rest hold text.
const INT_COLUMNS: [&str; 5] = [
    "available_at",
    "lease_until",
    "last_heartbeat_at",
    "delivery_count",
    "finished_at",
];

/// `CREATE [TEMPORARY] TABLE command (…)` with the dialect's type names.
fn create_command_table(d: &Dialect, temporary: bool) -> String {
    let (int, text) = d.types;
    let columns: Vec<String> = COMMAND
        .columns
        .iter()
        .map(|c| format!("{c} {}", if INT_COLUMNS.contains(c) { int } else { text }))
        .collect();
    let temp = if temporary { "TEMPORARY " } else { "" };
    format!("CREATE {temp}TABLE command ({}, PRIMARY KEY (id))", columns.join(", "))
}

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

fn token() -> impl Strategy<Value = Option<LeaseToken>> {
    prop_oneof![
        Just(None),
        Just(Some(LeaseToken::new("t1"))),
        Just(Some(LeaseToken::new("t2")))
    ]
}

fn status() -> impl Strategy<Value = CommandStatus> {
    proptest::sample::select(CommandStatus::ALL.to_vec())
}

/// Rows around the edges the guards test: times within a few milliseconds of each
/// other, missing deadlines, one of two tokens or none.
fn command() -> impl Strategy<Value = Command> {
    (status(), 0i64..6, token(), proptest::option::of(0i64..6)).prop_map(|(status, available, token, until)| Command {
        id: CommandId::new("c1"),
        attempt_id: AttemptId::new("a1"),
        status,
        available_at: at(available),
        lease_owner: token.as_ref().map(|_| "w1".to_owned()),
        lease_token: token,
        lease_until: until.map(at),
        last_heartbeat_at: None,
        delivery_count: 1,
        last_error: None,
        finished_at: None,
        queue: String::new(),
        executor: String::new(),
        target: String::new(),
    })
}

fn guard() -> impl Strategy<Value = Guard> {
    prop_oneof![
        token().prop_filter_map("a held lease has a token", |t| t.map(Guard::Holds)),
        (0i64..6).prop_map(|now| Guard::Claimable(at(now))),
        (status(), token()).prop_map(|(status, lease_token)| Guard::Unchanged { status, lease_token }),
    ]
}

/// `SELECT COUNT(*) FROM command WHERE id = ? AND <guard>` for the dialect.
fn count_sql<'a>(d: &'static Dialect, guard: &'a Guard) -> (String, Vec<Value<'a>>) {
    let mut sql = super::Sql::new(d);
    sql.push("SELECT COUNT(*) FROM command WHERE id = ")
        .bind(Value::Text("c1"));
    let mut next = 2;
    sql.push(" AND ");
    super::write::push_guard_text(d, &mut sql.text, &mut next, guard);
    let mut values = sql.values;
    values.extend(super::write::guard_values(guard));
    (sql.text, values)
}

mod sqlite {
    use super::*;
    use crate::ledger::sqlite::rows::bind;
    use rusqlite::{params_from_iter, Connection};

    fn store(conn: &Connection, c: &Command) {
        conn.execute("DELETE FROM command", []).unwrap();
        let marks = super::super::placeholders(&SQLITE, 1, COMMAND.columns.len());
        let sql = format!("INSERT INTO command ({}) VALUES ({marks})", COMMAND.column_list(None));
        conn.execute(&sql, params_from_iter(command_values(c).iter().map(bind)))
            .unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn the_rendered_guard_agrees_with_guard_admits_on_sqlite(c in command(), g in guard()) {
            let conn = Connection::open_in_memory().unwrap();
            conn.execute_batch(&create_command_table(&SQLITE, false)).unwrap();
            store(&conn, &c);
            let (sql, values) = count_sql(&SQLITE, &g);
            let n: i64 = conn.query_row(&sql, params_from_iter(values.iter().map(bind)), |r| r.get(0)).unwrap();
            prop_assert_eq!(n == 1, g.admits(Some(&c)), "{} on {:?}", sql, c.status);
            // The check that a write which leaves the command alone makes.
            let attempt = AttemptId::new("a1");
            let check = guard_check(&SQLITE, &attempt, &g);
            let holds: bool = conn
                .query_row(&check.sql, params_from_iter(check.values.iter().map(bind)), |r| r.get(1))
                .unwrap();
            prop_assert_eq!(holds, g.admits(Some(&c)));
            let (condition, _) = guard_condition(&SQLITE, &g);
            prop_assert!(!condition.contains("t1") && !condition.contains("t2"), "tokens are bound, never inlined");
        }
    }
}

mod mysql {
    use super::*;
    use crate::ledger::mysql::session::to_mysql;
    use mysql_async::prelude::Queryable;
    use mysql_async::{Conn, Opts, Params};

    fn params(values: &[Value<'_>]) -> Params {
        Params::Positional(values.iter().map(to_mysql).collect())
    }

    #[test]
    fn the_rendered_guard_agrees_with_guard_admits_on_mysql() {
        let Ok(url) = std::env::var("LEASEHOLD_TEST_MYSQL_URL") else {
            eprintln!("LEASEHOLD_TEST_MYSQL_URL is not set: the MySQL guard property is skipped");
            return;
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let conn: Conn = rt.block_on(async {
            let mut conn = Conn::new(Opts::from_url(&url).unwrap()).await.unwrap();
            // A temporary table: this connection's own, shadowing any real `command`.
            conn.query_drop(create_command_table(&MYSQL, true)).await.unwrap();
            conn
        });
        let conn = tokio::sync::Mutex::new(conn);
        let config = ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        };
        proptest::test_runner::TestRunner::new(config)
            .run(&(command(), guard()), |(c, g)| {
                let (n, holds) = rt.block_on(async {
                    let mut conn = conn.lock().await;
                    conn.query_drop("DELETE FROM command").await.unwrap();
                    let marks = super::super::placeholders(&MYSQL, 1, COMMAND.columns.len());
                    let sql = format!("INSERT INTO command ({}) VALUES ({marks})", COMMAND.column_list(None));
                    conn.exec_drop(sql, params(&command_values(&c))).await.unwrap();
                    let (sql, values) = count_sql(&MYSQL, &g);
                    let n: Option<i64> = conn.exec_first(sql, params(&values)).await.unwrap();
                    let attempt = AttemptId::new("a1");
                    let check = guard_check(&MYSQL, &attempt, &g);
                    let row: Option<(String, i64)> = conn.exec_first(&*check.sql, params(&check.values)).await.unwrap();
                    (n.unwrap_or(0), row.map(|(_, h)| h != 0))
                });
                prop_assert_eq!(n == 1, g.admits(Some(&c)), "{:?}", c.status);
                prop_assert_eq!(holds, Some(g.admits(Some(&c))));
                Ok(())
            })
            .unwrap();
        let mut conn = conn.into_inner();
        rt.block_on(async {
            let _ = conn.query_drop("DROP TEMPORARY TABLE command").await;
            let _ = conn.disconnect().await;
        });
    }
}

mod postgres {
    use super::*;
    use crate::ledger::postgres::PostgresUrl;

    /// A shared [`Value`] as the driver binds it.
    enum Param<'a> {
        Int(Option<i64>),
        Text(Option<&'a str>),
    }

    /// Runs `sql` with `values`; a NULL is bound as a NULL of the placeholder's type.
    async fn rows(client: &tokio_postgres::Client, sql: &str, values: &[Value<'_>]) -> Vec<tokio_postgres::Row> {
        use tokio_postgres::types::{ToSql, Type};
        let statement = client.prepare(sql).await.unwrap();
        let params: Vec<Param<'_>> = values
            .iter()
            .zip(statement.params())
            .map(|(v, ty)| match (*v, *ty == Type::INT8) {
                (Value::Int(i), _) => Param::Int(Some(i)),
                (Value::Null, true) => Param::Int(None),
                (Value::Null, false) => Param::Text(None),
                (Value::Text(t), _) => Param::Text(Some(t)),
            })
            .collect();
        let refs: Vec<&(dyn ToSql + Sync)> = params
            .iter()
            .map(|p| match p {
                Param::Int(v) => v as &(dyn ToSql + Sync),
                Param::Text(v) => v,
            })
            .collect();
        client.query(&statement, &refs).await.unwrap()
    }

    #[test]
    fn the_rendered_guard_agrees_with_guard_admits_on_postgres() {
        let Ok(url) = std::env::var("LEASEHOLD_TEST_POSTGRES_URL") else {
            eprintln!("LEASEHOLD_TEST_POSTGRES_URL is not set: the PostgreSQL guard property is skipped");
            return;
        };
        let url = PostgresUrl::parse(&url).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let (client, connection) = url.config().connect(tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            // A temporary table: this connection's own, shadowing any real `command`.
            client
                .batch_execute(&create_command_table(&POSTGRES, true))
                .await
                .unwrap();
            client
        });
        let config = ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        };
        proptest::test_runner::TestRunner::new(config)
            .run(&(command(), guard()), |(c, g)| {
                let (n, holds) = rt.block_on(async {
                    client.batch_execute("DELETE FROM command").await.unwrap();
                    let marks = super::super::placeholders(&POSTGRES, 1, COMMAND.columns.len());
                    let sql = format!("INSERT INTO command ({}) VALUES ({marks})", COMMAND.column_list(None));
                    rows(&client, &sql, &command_values(&c)).await;
                    let (sql, values) = count_sql(&POSTGRES, &g);
                    let n: i64 = rows(&client, &sql, &values).await[0].get(0);
                    let attempt = AttemptId::new("a1");
                    let check = guard_check(&POSTGRES, &attempt, &g);
                    let row = rows(&client, &check.sql, &check.values).await;
                    (n, row.first().map(|r| r.get::<_, i32>(1) != 0))
                });
                prop_assert_eq!(n == 1, g.admits(Some(&c)), "{:?}", c.status);
                prop_assert_eq!(holds, Some(g.admits(Some(&c))));
                Ok(())
            })
            .unwrap();
    }
}

/// What a SQL ledger holding one attempt counts once a test has damaged its pair
/// (the attempt SUCCEEDED, its command back to PENDING): the open count and the
/// console's QUEUED and RUNNING counts go by the command, the ended states by the
/// attempt.
pub(crate) async fn assert_damaged_pair_counted_by_command(ledger: &impl crate::ledger::Ledger) {
    use leasehold_engine::AttemptStatus;
    let count = |status| async move { ledger.count_attempts(10).await.unwrap().get(status).unwrap().count };
    assert_eq!(ledger.open_attempts().await.unwrap(), 1, "a PENDING command is open");
    assert_eq!(
        count(AttemptStatus::Queued).await,
        1,
        "counted QUEUED by its PENDING command"
    );
    assert_eq!(count(AttemptStatus::Running).await, 0);
    assert_eq!(
        count(AttemptStatus::Succeeded).await,
        1,
        "an ended status is the attempt's own"
    );
}

/// A write that ends an attempt stands when the claim fused with it is refused: the
/// next command's plan is damaged by `damage` (given its id), so the claim fails its
/// integrity check; the write is applied alone, nothing is claimed, and the damaged
/// attempt stays queued.
pub(crate) async fn assert_a_fused_write_stands_when_its_claim_is_refused<L, F, Fut>(ledger: &L, damage: F)
where
    L: crate::ledger::Ledger,
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use leasehold_engine::{Action, AttemptStatus, ClaimRequest, CommandStatus, PlanSpec, Reply, WorkerRequest};
    let plan = |name: &str| -> PlanSpec {
        serde_json::from_value(serde_json::json!({
            "name": name, "recovery": "resume",
            "steps": [{"code": "s", "executor": "dry-run:v1", "payload": {}}],
        }))
        .unwrap()
    };
    let first = ledger
        .register_plan(plan("fused-first"), &["dry-run:v1"])
        .await
        .unwrap();
    let second = ledger
        .register_plan(plan("fused-second"), &["dry-run:v1"])
        .await
        .unwrap();
    let ended = ledger.enqueue(&first.id, Action::Execute).await.unwrap();
    let lease = ledger.claim("w", 1, 30_000).await.unwrap().remove(0).lease;
    assert_eq!(lease.attempt_id, ended.attempt.id);
    let queued = ledger.enqueue(&second.id, Action::Execute).await.unwrap();
    damage(second.id.to_string()).await;
    let fail = WorkerRequest::Fail {
        ordinal: None,
        error: "ends here".into(),
    };
    let claim = ClaimRequest {
        owner: "w".into(),
        batch: 1,
        lease_ms: 30_000,
        begin: true,
        capabilities: None,
    };
    let (reply, claimed) = ledger.worker_then_claim(&lease, fail, claim).await.unwrap();
    assert_eq!(reply, Reply::Applied);
    assert!(claimed.is_empty(), "{claimed:?}");
    let record = ledger.attempt(&ended.attempt.id).await.unwrap();
    assert_eq!(
        (record.attempt.status, record.command.status),
        (AttemptStatus::Failed, CommandStatus::Failed),
        "the write stands"
    );
    let waiting = ledger.attempt(&queued.attempt.id).await.unwrap();
    assert_eq!(waiting.command.status, CommandStatus::Pending, "nothing was claimed");
}
