//! Enqueue from SQL: the PostgreSQL function and the MySQL / MariaDB procedure
//! `leasehold_enqueue`, installed by the migrations, write exactly the rows the Rust
//! outbox writes. Each case enqueues the same request both ways on a scratch
//! database (`LEASEHOLD_TEST_POSTGRES_URL`, `LEASEHOLD_TEST_MYSQL_URL`): first with the
//! routine, reading back every column of the attempt, its receipts and its command,
//! then with [`Outbox`] given the routine's ids and instant, and compares the rows
//! column by column (input, frozen payloads, fingerprints, idempotency keys, trace
//! context, targets, statuses). A refused request must be refused both ways with the
//! same message. Without a variable its backend's tests print why they are skipped and
//! pass.

use leasehold::clock::ManualClock;
use leasehold::engine::transition::Start;
use leasehold::engine::{Action, PlanId, PlanSpec, Timestamp};
use leasehold::entropy::{Entropy, IdKind, OsEntropy};
use leasehold::ledger::{EnqueueRequest, Enqueued, Ledger, LedgerError};
use leasehold::outbox::Outbox;
use serde_json::{json, Value};
use std::sync::Arc;

/// One enqueue request, as both ways take it.
#[derive(Debug, Clone, Default)]
struct Request {
    /// The input as JSON text (the routine takes the text, the outbox its parse).
    input: Option<String>,
    order_key: Option<String>,
    key: Option<String>,
    after_ms: Option<i64>,
}

impl Request {
    fn input(text: &str) -> Self {
        Self {
            input: Some(text.to_owned()),
            ..Self::default()
        }
    }

    fn ordered(mut self, key: &str) -> Self {
        self.order_key = Some(key.to_owned());
        self
    }

    fn keyed(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }

    fn after(mut self, ms: i64) -> Self {
        self.after_ms = Some(ms);
        self
    }

    /// The outbox's request.
    fn outbox(&self) -> EnqueueRequest {
        let input = self
            .input
            .as_deref()
            .map(|t| serde_json::from_str(t).expect("the case's input is JSON"));
        let start = self.after_ms.map_or(Start::Now, |ms| Start::After(ms as u64));
        EnqueueRequest::new(Action::Execute)
            .at(start)
            .keyed(self.key.clone())
            .with_input(input)
            .ordered(self.order_key.clone())
    }
}

/// What an enqueue answered: the attempt and whether it was created, or the error's
/// SQLSTATE and message (the outbox's error, as the routines would raise it).
type Answer = Result<(String, bool), (String, String)>;

/// An attempt's rows: the attempt, its receipts by ordinal, its command, each a JSON
/// object of column → value.
#[derive(Debug, Clone, PartialEq)]
struct Rows {
    attempt: Value,
    receipts: Vec<Value>,
    command: Value,
}

/// Answers the attempt and command ids the routine minted, then nothing.
struct Replay {
    attempt: String,
    command: String,
}

impl Entropy for Replay {
    fn next_u64(&self) -> u64 {
        panic!("the replayed enqueue draws only its two ids")
    }

    fn id(&self, kind: IdKind) -> String {
        match kind {
            IdKind::Attempt => self.attempt.clone(),
            IdKind::Command => self.command.clone(),
            IdKind::Plan => panic!("the replayed enqueue mints no plan"),
        }
    }
}

/// The SQLSTATE a ledger error is raised with by the routines.
fn sqlstate(e: &LedgerError) -> &'static str {
    match e {
        LedgerError::BadInput(_) => "22023",
        LedgerError::Refused(_) => "55000",
        LedgerError::NotFound { .. } => "P0002",
        other => panic!("no routine raises {other:?}"),
    }
}

/// The plans every backend's cases enqueue: a template with an `http:v1` step, a
/// queue, a delivery policy and `on_failure`, and a plan without input.
fn template() -> PlanSpec {
    serde_json::from_value(json!({
        "name": "sql-orders",
        "recovery": "resume",
        "queue": "shop",
        "on_failure": "continue",
        "retry": {"max_deliveries": 5},
        "input": {
            "order": {"type": "object", "required": true},
            "note": {"type": "string", "max_bytes": 16},
            "count": {"type": "integer"},
            "price": {"type": "number"},
            "tags": {"type": "array"},
            "flag": {"type": "boolean"},
            "blob": {"type": "string"}
        },
        "steps": [
            {"code": "push", "executor": "http:v1", "payload": {
                "url": "https://CRM.example.com/orders",
                "body": {"order": {"$input": "/order"}, "n": {"$input": "/count"}, "price": {"$input": "/price"},
                         "note": {"$input": "/note"}, "fixed": [1.5, 100, "é"]}}},
            {"code": "record", "executor": "dry-run:v1", "target": "books", "payload": {
                "all": {"$input": ""}, "first_tag": {"$input": "/tags/0"}, "blob": {"$input": "/blob"},
                "again": {"$input": "/blob"}}}
        ]
    }))
    .expect("the template")
}

fn plain() -> PlanSpec {
    serde_json::from_value(json!({
        "name": "sql-plain",
        "recovery": "replay",
        "steps": [{"code": "one", "executor": "dry-run:v1", "payload": {"n": 1}},
                  {"code": "two", "executor": "dry-run:v1", "payload": {}}]
    }))
    .expect("the plain plan")
}

const EXECUTORS: &[&str] = &["dry-run:v1", "http:v1"];

/// Requests both ways must write the same rows for (on the template).
fn same_rows_cases() -> Vec<Request> {
    vec![
        Request::input(r#"{"order": {"id": 7, "lines": [{"sku": "a", "qty": 2}]}, "count": 3}"#),
        Request::input(
            r#"{"order": {"id": 1E2, "z": -0, "big": 18446744073709551616, "f": 1.50, "e": 1e-7,
                "é": "x", "Z": 1, "aa": 2, "a": {"b": [0.1, 1e16, 1e15, 9007199254740994.0, -1.5e300, 0.00001]}},
                "price": 12.5, "flag": true, "tags": ["x\n\u001f\"\\/\u007f", "€"], "note": "héllo"}"#,
        ),
        Request::input(r#"{"order": {"id": 1, "id": 2}, "count": 1, "count": 5}"#),
        Request::input(r#"{"order": {}}"#),
        Request::input(r#"{"order": {"id": -9223372036854775808, "u": 18446744073709551615}, "price": -0.0}"#)
            .ordered("user-1")
            .keyed("sql-k-1")
            .after(5000),
        Request::input(r#"{"order": {"id": "x"}, "tags": [[]]}"#).ordered("user-3"),
    ]
}

/// Requests both ways must refuse with the same message (on the template).
fn refused_cases() -> Vec<Request> {
    let big = "x".repeat(40_000);
    let huge = "x".repeat(70_000);
    vec![
        Request::input(r#"{"count": 1}"#),
        Request::input(r#"{"order": {}, "count": "3"}"#),
        Request::input(r#"{"order": {}, "count": 2.5}"#),
        Request::input(r#"{"order": {}, "count": 1.0}"#),
        Request::input(r#"{"order": {}, "note": "this is far too long for it"}"#),
        Request::input(r#"{"order": {}, "who": 1, "alpha": 2}"#),
        Request::input("[1]"),
        Request::input("null"),
        Request::input(r#"{"order": 5}"#),
        Request::input(r#"{"order": {}, "tags": []}"#),
        Request::input(&format!(r#"{{"order": {{}}, "blob": "{big}"}}"#)),
        Request::input(&format!(r#"{{"order": {{}}, "blob": "{huge}"}}"#)),
        Request::input(r#"{"order": {}}"#).ordered(""),
        Request::input(r#"{"order": {}}"#).ordered("a\tb"),
        Request::input(r#"{"order": {}}"#).ordered(&"k".repeat(256)),
        Request::input(r#"{"order": {}}"#).keyed("k\u{200b}"),
    ]
}

/// One way to enqueue: the routine, or the Rust outbox.
enum Way {
    Routine,
    Outbox(Outbox),
}

/// The backend-specific half: its ledger, its transactions, the routine's call, the
/// outbox's enqueue and an attempt's rows read back.
trait Backend {
    /// A transaction of the application's session.
    type Tx<'a>
    where
        Self: 'a;
    /// Registers `spec` through the ledger.
    async fn register(&self, spec: PlanSpec) -> PlanId;
    /// Retires `plan` through the ledger.
    async fn retire(&self, plan: &PlanId);
    /// Runs one statement of the backend's dialect.
    async fn exec(&mut self, sql: &str);
    async fn begin(&mut self) -> Self::Tx<'_>;
    /// Commits with `keep`, else rolls back.
    async fn end(tx: Self::Tx<'_>, keep: bool);
    /// Calls the routine.
    async fn call(tx: &mut Self::Tx<'_>, plan: &PlanId, r: &Request) -> Answer;
    /// Enqueues with `outbox`.
    async fn enqueue_rust(tx: &mut Self::Tx<'_>, outbox: Outbox, plan: &PlanId, r: &Request) -> Answer;
    /// Every column of the attempt `id`, its receipts and its command.
    async fn rows(tx: &mut Self::Tx<'_>, id: &str) -> Rows;

    /// Enqueues `r` one `way` in a transaction of its own, which commits with `keep`
    /// and else rolls back after the rows written are read.
    async fn enqueue(&mut self, way: Way, plan: &PlanId, r: &Request, keep: bool) -> (Answer, Option<Rows>) {
        let mut tx = self.begin().await;
        let answer = match way {
            Way::Routine => Self::call(&mut tx, plan, r).await,
            Way::Outbox(outbox) => Self::enqueue_rust(&mut tx, outbox, plan, r).await,
        };
        let rows = match &answer {
            Ok((id, _)) => Some(Self::rows(&mut tx, id).await),
            Err(_) => None,
        };
        Self::end(tx, keep).await;
        (answer, rows)
    }
}

/// The tables an attempt's rows are read back from: the table, the column naming the
/// attempt, the order of its rows.
const ROW_TABLES: [(&str, &str, &str); 3] = [
    ("attempt", "id", "id"),
    ("receipt", "attempt_id", "ordinal"),
    ("command", "attempt_id", "id"),
];

/// [`Rows`] of the objects read from [`ROW_TABLES`], in that order.
fn rows_of(read: Vec<Vec<Value>>) -> Rows {
    let [attempt, receipts, command]: [Vec<Value>; 3] = read.try_into().expect("three tables");
    Rows {
        attempt: attempt.into_iter().next().expect("the attempt"),
        receipts,
        command: command.into_iter().next().expect("the command"),
    }
}

/// The outbox's answer as the routines give theirs.
fn answer(enqueued: Result<Enqueued, LedgerError>) -> Answer {
    enqueued
        .map(|e| (e.record.attempt.id.to_string(), e.created))
        .map_err(|e| (sqlstate(&e).to_owned(), e.to_string()))
}

async fn register(ledger: &impl Ledger, spec: PlanSpec) -> PlanId {
    ledger.register_plan(spec, EXECUTORS).await.expect("register").id
}

async fn retire(ledger: &impl Ledger, plan: &PlanId) {
    ledger.retire_plan(plan).await.expect("retire");
}

/// The routine's rows and the outbox's for `r`, both rolled back.
async fn both_ways<B: Backend>(b: &mut B, plan: &PlanId, r: &Request) -> (Rows, Rows) {
    let (answer, sql_rows) = b.enqueue(Way::Routine, plan, r, false).await;
    let (attempt, created) = answer.unwrap_or_else(|e| panic!("{r:?}: the routine refused: {e:?}"));
    assert!(created, "{r:?}");
    let sql_rows = sql_rows.expect("the routine's rows");
    let command = sql_rows.command["id"].as_str().expect("command id").to_owned();
    let now = sql_rows.attempt["created_at"].as_i64().expect("created_at");
    let outbox = Outbox::new()
        .with_clock(Arc::new(ManualClock::new(Timestamp::from_millis(now))))
        .with_entropy(Arc::new(Replay { attempt, command }));
    let (answer, rust_rows) = b.enqueue(Way::Outbox(outbox), plan, r, false).await;
    answer.unwrap_or_else(|e| panic!("{r:?}: the outbox refused: {e:?}"));
    (sql_rows, rust_rows.expect("the outbox's rows"))
}

/// The routine's refusal of `r` and the outbox's, as (SQLSTATE, message).
async fn refusals<B: Backend>(b: &mut B, plan: &PlanId, r: &Request) -> ((String, String), (String, String)) {
    let (answer, _) = b.enqueue(Way::Routine, plan, r, false).await;
    let sql = answer.expect_err(&format!("{r:?}: the routine must refuse"));
    let (answer, _) = b.enqueue(Way::Outbox(Outbox::new()), plan, r, false).await;
    let mut rust = answer.expect_err(&format!("{r:?}: the outbox must refuse"));
    // MySQL keeps the first 128 characters of a routine's message.
    if sql.1.chars().count() >= 128 && rust.1.starts_with(&sql.1) {
        rust.1.clone_from(&sql.1);
    }
    (sql, rust)
}

async fn same_rows_as_the_outbox<B: Backend>(b: &mut B) {
    let template = b.register(template()).await;
    for r in same_rows_cases() {
        let (sql, rust) = both_ways(b, &template, &r).await;
        assert_eq!(sql, rust, "{r:?}");
        assert!(sql.attempt["input_sha256"].is_string(), "{sql:?}");
        assert_eq!(sql.receipts.len(), 2, "{sql:?}");
    }
    // Behind an open attempt on its order key: WAITING both ways.
    let first = Request::input(r#"{"order": {"id": 1}}"#).ordered("user-2");
    let (answer, _) = b.enqueue(Way::Routine, &template, &first, true).await;
    answer.expect("the first on user-2");
    let (sql, rust) = both_ways(
        b,
        &template,
        &Request::input(r#"{"order": {"id": 2}}"#).ordered("user-2"),
    )
    .await;
    assert_eq!(sql.command["status"], "WAITING", "{sql:?}");
    assert_eq!(sql, rust);
    let plain = b.register(plain()).await;
    let (sql, rust) = both_ways(b, &plain, &Request::default().keyed("plain-k").after(250)).await;
    assert_eq!(sql.receipts[0]["payload"], Value::Null, "{sql:?}");
    assert_eq!(sql, rust);
}

async fn the_same_refusals_as_the_outbox<B: Backend>(b: &mut B) {
    let template = b.register(template()).await;
    for r in refused_cases() {
        let (sql, rust) = refusals(b, &template, &r).await;
        assert_eq!(sql, rust, "{r:?}");
    }
    let missing = PlanId::new("pln-missing");
    let (sql, rust) = refusals(b, &missing, &Request::input("{}")).await;
    assert_eq!(sql, rust);
    let plain = b.register(plain()).await;
    for r in [Request::input("{}"), Request::default().ordered("u")] {
        let (sql, rust) = refusals(b, &plain, &r).await;
        assert_eq!(sql, rust, "{r:?}");
    }
    let (answer, _) = b.enqueue(Way::Routine, &plain, &Request::default(), true).await;
    answer.expect("the plain plan's first attempt");
    let (sql, rust) = refusals(b, &plain, &Request::default()).await;
    assert_eq!((sql.0.as_str(), &sql), ("55000", &rust));
    // What the outbox's caller cannot even build: a delay before now, a number that
    // is no f64 (serde_json refuses to parse it).
    for r in [
        Request::input(r#"{"order": {}}"#).after(-1),
        Request::input(r#"{"order": {}, "count": 1e400}"#),
    ] {
        let (answer, _) = b.enqueue(Way::Routine, &template, &r, false).await;
        assert_eq!(answer.expect_err("refused").0, "22023", "{r:?}");
    }
    b.retire(&template).await;
    let (sql, rust) = refusals(b, &template, &Request::input(r#"{"order": {}}"#)).await;
    assert_eq!(sql, rust);
}

async fn enqueue_keys_answer_the_first_attempt<B: Backend>(b: &mut B) {
    let template = b.register(template()).await;
    let first = Request::input(r#"{"order": {"id": 9}}"#).keyed("k-9").ordered("u-9");
    let (answer, _) = b.enqueue(Way::Outbox(Outbox::new()), &template, &first, true).await;
    let (attempt, created) = answer.expect("the outbox's enqueue");
    assert!(created);
    let (answer, _) = b.enqueue(Way::Routine, &template, &first, true).await;
    assert_eq!(answer.expect("the same request again"), (attempt.clone(), false));
    let other = Request::input(r#"{"order": {"id": 10}}"#).keyed("k-9").ordered("u-9");
    let (sql, rust) = refusals(b, &template, &other).await;
    assert_eq!(sql, rust);
    assert!(sql.1.contains(&attempt), "{sql:?}");
    // A plan row changed behind the ledger's back no longer matches its fingerprint.
    let tampered = b.register(plain()).await;
    b.exec(&format!("UPDATE plan SET name = 'changed' WHERE id = '{tampered}'"))
        .await;
    let (sql, rust) = refusals(b, &tampered, &Request::default()).await;
    assert_eq!(sql, rust);
    assert!(sql.1.contains("fingerprint"), "{sql:?}");
}

/// A plan registered before step targets were stored (`targets_json` NULL) with an
/// `http:v1` step is refused until it is registered again, which stores them.
async fn registering_again_stores_the_targets<B: Backend>(b: &mut B) {
    let plan = b.register(template()).await;
    b.exec(&format!("UPDATE plan SET targets_json = NULL WHERE id = '{plan}'"))
        .await;
    let r = Request::input(r#"{"order": {"id": 3}}"#);
    let (answer, _) = b.enqueue(Way::Routine, &plan, &r, false).await;
    let (state, message) = answer.expect_err("no targets for an http:v1 step");
    assert_eq!(state, "55000");
    assert!(message.contains("register it again"), "{message}");
    assert_eq!(b.register(template()).await, plan);
    let (sql, rust) = both_ways(b, &plan, &r).await;
    assert_eq!(sql.receipts[0]["target"], "https://crm.example.com:443", "{sql:?}");
    assert_eq!(sql, rust);
}

mod postgres {
    use super::*;
    use leasehold::ledger::postgres::scratch::ScratchDatabase;
    use leasehold::ledger::postgres::{PostgresLedger, PostgresUrl};
    use leasehold::outbox::tokio_postgres::types::ToSql;
    use leasehold::outbox::tokio_postgres::{AsyncMessage, Client, NoTls, Transaction};
    use tokio::sync::mpsc;

    const URL_VAR: &str = "LEASEHOLD_TEST_POSTGRES_URL";

    pub(super) struct Pg {
        _db: ScratchDatabase,
        ledger: PostgresLedger,
        client: Client,
        pub(super) notifications: mpsc::UnboundedReceiver<String>,
    }

    pub(super) async fn open() -> Option<Pg> {
        let admin = match std::env::var(URL_VAR) {
            Ok(url) if !url.is_empty() => PostgresUrl::parse(&url).unwrap_or_else(|e| panic!("{URL_VAR}: {e}")),
            _ => {
                println!("skipped: {URL_VAR} is not set (e.g. {URL_VAR}=postgres://postgres@127.0.0.1:5432/test)");
                return None;
            }
        };
        let db = ScratchDatabase::create(&admin, "lh_sqlenq_")
            .await
            .expect("a scratch database");
        let ledger = PostgresLedger::open(db.url(), Arc::new(OsEntropy)).expect("open");
        ledger.migrate().await.expect("migrate");
        let (client, mut connection) = db.url().config().connect(NoTls).await.expect("a session");
        let (tx, notifications) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                if let AsyncMessage::Notification(n) = message {
                    let _ = tx.send(n.channel().to_owned());
                }
            }
        });
        Some(Pg {
            _db: db,
            ledger,
            client,
            notifications,
        })
    }

    impl Backend for Pg {
        type Tx<'a> = Transaction<'a>;

        async fn register(&self, spec: PlanSpec) -> PlanId {
            register(&self.ledger, spec).await
        }

        async fn retire(&self, plan: &PlanId) {
            retire(&self.ledger, plan).await
        }

        async fn exec(&mut self, sql: &str) {
            self.client.batch_execute(sql).await.expect(sql);
        }

        async fn begin(&mut self) -> Self::Tx<'_> {
            self.client.transaction().await.expect("begin")
        }

        async fn end(tx: Self::Tx<'_>, keep: bool) {
            if keep {
                tx.commit().await.expect("commit");
            } else {
                tx.rollback().await.expect("rollback");
            }
        }

        async fn call(tx: &mut Self::Tx<'_>, plan: &PlanId, r: &Request) -> Answer {
            let sql = "SELECT attempt_id, created FROM leasehold_enqueue($1, $2::text::json, $3, $4, $5)";
            let params: [&(dyn ToSql + Sync); 5] = [&plan.as_str(), &r.input, &r.order_key, &r.key, &r.after_ms];
            match tx.query_one(sql, &params).await {
                Ok(row) => Ok((row.get(0), row.get(1))),
                Err(e) => {
                    let db = e.as_db_error().unwrap_or_else(|| panic!("not a server error: {e}"));
                    Err((db.code().code().to_owned(), db.message().to_owned()))
                }
            }
        }

        async fn enqueue_rust(tx: &mut Self::Tx<'_>, outbox: Outbox, plan: &PlanId, r: &Request) -> Answer {
            answer(outbox.enqueue_postgres_with(tx, plan, r.outbox()).await)
        }

        async fn rows(tx: &mut Self::Tx<'_>, id: &str) -> Rows {
            let mut read = Vec::new();
            for (table, key, order) in ROW_TABLES {
                let sql = format!("SELECT to_jsonb(t)::text FROM {table} t WHERE {key} = $1 ORDER BY {order}");
                let rows = tx.query(&sql, &[&id]).await.expect("read back");
                let objects: Vec<Value> = rows
                    .iter()
                    .map(|r| serde_json::from_str(r.get::<_, &str>(0)).expect("a row as JSON"))
                    .collect();
                read.push(objects);
            }
            rows_of(read)
        }
    }
}

mod mysql {
    use super::*;
    use leasehold::ledger::mysql::scratch::ScratchDatabase;
    use leasehold::ledger::mysql::{MysqlLedger, MysqlUrl};
    use leasehold::outbox::mysql_async::prelude::Queryable;
    use leasehold::outbox::mysql_async::{self as my, Conn, OptsBuilder, Transaction, TxOpts};

    const URL_VAR: &str = "LEASEHOLD_TEST_MYSQL_URL";

    pub(super) struct My {
        _db: ScratchDatabase,
        ledger: MysqlLedger,
        conn: Conn,
    }

    pub(super) async fn open() -> Option<My> {
        let admin = match std::env::var(URL_VAR) {
            Ok(url) if !url.is_empty() => MysqlUrl::parse(&url).unwrap_or_else(|e| panic!("{URL_VAR}: {e}")),
            _ => {
                println!("skipped: {URL_VAR} is not set (e.g. {URL_VAR}=mysql://root@127.0.0.1:3306/test)");
                return None;
            }
        };
        let db = ScratchDatabase::create(&admin, "lh_sqlenq_")
            .await
            .expect("a scratch database");
        let ledger = MysqlLedger::open(db.url(), Arc::new(OsEntropy));
        ledger.migrate().await.expect("migrate");
        let url = db.url();
        let opts = OptsBuilder::default()
            .ip_or_hostname(url.host.clone())
            .tcp_port(url.port)
            .user(url.user.clone())
            .pass(url.expose_password().map(str::to_owned))
            .db_name(Some(url.database.clone()));
        let conn = Conn::new(opts).await.expect("a connection");
        Some(My { _db: db, ledger, conn })
    }

    /// A row read with the binary protocol as a JSON object: text as strings,
    /// integers as numbers.
    fn object(row: my::Row) -> Value {
        let columns = row.columns();
        let values = row.unwrap();
        let mut out = serde_json::Map::new();
        for (column, value) in columns.iter().zip(values) {
            let v = match value {
                my::Value::NULL => Value::Null,
                my::Value::Int(i) => json!(i),
                my::Value::UInt(u) => json!(u),
                my::Value::Bytes(b) => Value::String(String::from_utf8(b).expect("a column in UTF-8")),
                other => panic!("unexpected column value {other:?}"),
            };
            out.insert(column.name_str().into_owned(), v);
        }
        Value::Object(out)
    }

    impl Backend for My {
        type Tx<'a> = Transaction<'a>;

        async fn register(&self, spec: PlanSpec) -> PlanId {
            register(&self.ledger, spec).await
        }

        async fn retire(&self, plan: &PlanId) {
            retire(&self.ledger, plan).await
        }

        async fn exec(&mut self, sql: &str) {
            self.conn.query_drop(sql).await.expect(sql);
        }

        async fn begin(&mut self) -> Self::Tx<'_> {
            self.conn.start_transaction(TxOpts::default()).await.expect("begin")
        }

        async fn end(tx: Self::Tx<'_>, keep: bool) {
            if keep {
                tx.commit().await.expect("commit");
            } else {
                tx.rollback().await.expect("rollback");
            }
        }

        async fn call(tx: &mut Self::Tx<'_>, plan: &PlanId, r: &Request) -> Answer {
            let params = (plan.as_str(), &r.input, &r.order_key, &r.key, r.after_ms);
            let sql = "CALL leasehold_enqueue(?, ?, ?, ?, ?, @lh_attempt, @lh_created)";
            match tx.exec_drop(sql, params).await {
                Ok(()) => {
                    let row: Option<(String, i64)> = tx
                        .query_first("SELECT @lh_attempt, @lh_created")
                        .await
                        .expect("the answer");
                    let (id, created) = row.expect("one row");
                    Ok((id, created != 0))
                }
                Err(my::Error::Server(e)) => Err((e.state, e.message)),
                Err(e) => panic!("not a server error: {e}"),
            }
        }

        async fn enqueue_rust(tx: &mut Self::Tx<'_>, outbox: Outbox, plan: &PlanId, r: &Request) -> Answer {
            answer(outbox.enqueue_mysql_with(tx, plan, r.outbox()).await)
        }

        async fn rows(tx: &mut Self::Tx<'_>, id: &str) -> Rows {
            let mut read = Vec::new();
            for (table, key, order) in ROW_TABLES {
                let sql = format!("SELECT * FROM {table} WHERE {key} = ? ORDER BY {order}");
                let rows: Vec<my::Row> = tx.exec(sql, (id,)).await.expect("read back");
                read.push(rows.into_iter().map(object).collect());
            }
            rows_of(read)
        }
    }
}

#[tokio::test]
async fn postgres_notifies_the_workers_on_commit_only() {
    let Some(mut pg) = postgres::open().await else { return };
    pg.exec("LISTEN leasehold_work; LISTEN lh_marker").await;
    let template = pg.register(template()).await;
    let request = Request::input(r#"{"order": {}}"#);
    let (answer, _) = pg.enqueue(Way::Routine, &template, &request, false).await;
    answer.expect("enqueued, then rolled back");
    let (answer, _) = pg.enqueue(Way::Routine, &template, &request, true).await;
    answer.expect("enqueued and committed");
    // The committed one's notification arrives; the rolled-back one's never was sent,
    // so it is the first and only one once a later marker arrives.
    pg.exec("NOTIFY lh_marker").await;
    let mut seen = Vec::new();
    while let Some(channel) = pg.notifications.recv().await {
        if channel == "lh_marker" {
            break;
        }
        seen.push(channel);
    }
    assert_eq!(seen, vec!["leasehold_work".to_owned()]);
}

/// A test per backend for each check, each on a scratch database of its own.
macro_rules! on_both_servers {
    ($($check:ident: $postgres:ident, $mysql:ident;)*) => {$(
        #[tokio::test]
        async fn $postgres() {
            if let Some(mut pg) = postgres::open().await {
                $check(&mut pg).await;
            }
        }

        #[tokio::test]
        async fn $mysql() {
            if let Some(mut my) = mysql::open().await {
                $check(&mut my).await;
            }
        }
    )*};
}

on_both_servers! {
    same_rows_as_the_outbox: postgres_writes_the_rows_the_outbox_writes, mysql_writes_the_rows_the_outbox_writes;
    the_same_refusals_as_the_outbox: postgres_refuses_what_the_outbox_refuses, mysql_refuses_what_the_outbox_refuses;
    enqueue_keys_answer_the_first_attempt: postgres_enqueue_keys_answer_the_first_attempt, mysql_enqueue_keys_answer_the_first_attempt;
    registering_again_stores_the_targets: postgres_plans_registered_again_get_their_targets, mysql_plans_registered_again_get_their_targets;
}
