use super::*;
use leasehold_engine::Action;
use serde_json::{json, Value};

fn request(code: &str, payload: Value) -> ExecRequest {
    crate::executor::tests::request(NAME, code, payload)
}

fn evidence(result: ExecutorResult) -> Value {
    match result {
        ExecutorResult::Done { evidence, .. } => evidence,
        other => panic!("expected done, got {other:?}"),
    }
}

fn permanent(result: ExecutorResult) -> String {
    match result {
        ExecutorResult::Permanent(message) => message,
        other => panic!("expected a permanent failure, got {other:?}"),
    }
}

fn create() -> Value {
    json!({
        "sql": ["CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, score REAL, raw BLOB)",
                "INSERT INTO t VALUES (1, 'a', 1.5, x'00ff'), (2, NULL, 2.0, NULL)"],
        "checks": [{"name": "rows", "query": "SELECT id, name, score, raw FROM t ORDER BY id"}],
    })
}

#[tokio::test]
async fn checks_collect_rows_as_json_values() {
    let sandbox = SqliteSandbox::new();
    let result = sandbox.execute(request("create", create())).await;
    assert_eq!(
        result,
        ExecutorResult::Done {
            evidence: json!({
                "sandbox_id": "sbx-att-1-d1",
                "checks": {"rows": [[1, "a", 1.5, "00ff"], [2, null, 2.0, null]]},
                "statements": 2,
            }),
            target_receipt: json!({"sandbox": "sbx-att-1-d1", "idempotency_key": "ik-create"}),
        }
    );
}

#[tokio::test]
async fn steps_of_one_delivery_share_a_sandbox() {
    let sandbox = SqliteSandbox::new();
    evidence(sandbox.execute(request("create", create())).await);
    let mut second = request(
        "count",
        json!({"sql": ["DELETE FROM t WHERE id = 2"], "checks": [{"name": "n", "query": "SELECT count(*) FROM t"}]}),
    );
    second.ordinal = 2;
    assert_eq!(evidence(sandbox.execute(second).await)["checks"]["n"], json!([[1]]));
}

#[tokio::test]
async fn two_deliveries_get_different_sandboxes_and_the_same_check_results() {
    let sandbox = SqliteSandbox::new();
    let first = evidence(sandbox.execute(request("create", create())).await);
    let mut redelivery = request("create", create());
    redelivery.delivery = 2;
    // A shared database would fail here: the table would already exist.
    let second = evidence(sandbox.execute(redelivery).await);
    assert_eq!(first["sandbox_id"], "sbx-att-1-d1");
    assert_eq!(second["sandbox_id"], "sbx-att-1-d2");
    assert_eq!(first["checks"], second["checks"]);
    assert_eq!(first["statements"], second["statements"]);
    assert_eq!(
        sandbox.open_sandboxes(),
        vec![(AttemptId::new("att-1"), 1), (AttemptId::new("att-1"), 2)]
    );
}

#[tokio::test]
async fn a_repeated_key_gets_the_same_answer_without_running_again() {
    let sandbox = SqliteSandbox::new();
    let first = sandbox.execute(request("create", create())).await;
    let again = sandbox.execute(request("create", create())).await;
    assert_eq!(first, again);
}

#[tokio::test]
async fn an_sql_error_names_the_step_and_the_statement() {
    let sandbox = SqliteSandbox::new();
    let payload = json!({"sql": ["CREATE TABLE a (x)", "INSERT INTO missing VALUES (1)"], "checks": []});
    assert_eq!(
        permanent(sandbox.execute(request("seed", payload)).await),
        "step seed: statement sql[1] failed: no such table: missing"
    );
}

#[tokio::test]
async fn a_failing_or_writing_check_is_a_permanent_failure() {
    let sandbox = SqliteSandbox::new();
    let bad = json!({"sql": [], "checks": [{"name": "n", "query": "SELECT * FROM nowhere"}]});
    assert_eq!(
        permanent(sandbox.execute(request("a", bad)).await),
        "step a: check checks[0] (n) failed: no such table: nowhere"
    );
    let writing =
        json!({"sql": ["CREATE TABLE w (x)"], "checks": [{"name": "w", "query": "INSERT INTO w VALUES (1)"}]});
    assert_eq!(
        permanent(sandbox.execute(request("b", writing)).await),
        "step b: check checks[0] (w) failed: not authorized"
    );
}

#[tokio::test]
async fn malformed_payloads_name_the_field() {
    let sandbox = SqliteSandbox::new();
    let cases = [
        (json!({"checks": []}), "step s: payload field sql is missing"),
        (
            json!({"sql": "SELECT 1", "checks": []}),
            "step s: payload field sql must be an array",
        ),
        (
            json!({"sql": [1], "checks": []}),
            "step s: payload field sql[0] must be a string",
        ),
        (json!({"sql": []}), "step s: payload field checks is missing"),
        (
            json!({"sql": [], "checks": {}}),
            "step s: payload field checks must be an array",
        ),
        (
            json!({"sql": [], "checks": [{"name": "x"}]}),
            "step s: payload field checks[0].query is missing",
        ),
        (
            json!({"sql": [], "checks": [{"name": 1, "query": "SELECT 1"}]}),
            "step s: payload field checks[0].name must be",
        ),
        (
            json!({"sql": [], "checks": [{"name": "x", "query": "SELECT 1"}, {"name": "x", "query": "SELECT 2"}]}),
            "step s: payload field checks[1].name \"x\" is used by an earlier check",
        ),
        (
            json!({"sql": [], "checks": [], "chekcs": []}),
            "step s: payload field \"chekcs\" is not known",
        ),
        (
            json!({"sql": [], "checks": [], "delay_ms": "1s"}),
            "step s: payload field delay_ms must be",
        ),
        (
            json!({"sql": [], "checks": [], "undo_sql": "DROP TABLE x"}),
            "step s: payload field undo_sql must be",
        ),
    ];
    for (payload, expected) in cases {
        let message = permanent(sandbox.execute(request("s", payload)).await);
        assert!(
            message.starts_with(expected),
            "{message:?} should start with {expected:?}"
        );
    }
}

#[tokio::test]
async fn release_drops_the_sandbox() {
    let sandbox = SqliteSandbox::new();
    evidence(sandbox.execute(request("create", create())).await);
    sandbox.release(&AttemptId::new("att-other"), 1);
    assert_eq!(sandbox.open_sandboxes().len(), 1);
    sandbox.release(&AttemptId::new("att-1"), 1);
    assert!(sandbox.open_sandboxes().is_empty());
    // The same delivery after release starts from an empty database again.
    let count = json!({"sql": [], "checks": [{"name": "tables", "query": "SELECT count(*) FROM sqlite_master"}]});
    assert_eq!(
        evidence(sandbox.execute(request("count", count)).await)["checks"]["tables"],
        json!([[0]])
    );
}

#[tokio::test]
async fn compensate_runs_undo_sql_and_marks_the_evidence() {
    let sandbox = SqliteSandbox::new();
    let mut payload = create();
    payload["undo_sql"] = json!(["DROP TABLE IF EXISTS t"]);
    evidence(sandbox.execute(request("create", payload.clone())).await);
    let mut undo = request("create", payload);
    undo.action = Action::Compensate;
    undo.idempotency_key = "ik-undo".into();
    assert_eq!(
        evidence(sandbox.execute(undo).await),
        json!({"sandbox_id": "sbx-att-1-d1", "checks": {}, "statements": 1, "compensated": true})
    );
    let tables = json!({"sql": [], "checks": [{"name": "n", "query": "SELECT count(*) FROM sqlite_master"}]});
    assert_eq!(
        evidence(sandbox.execute(request("after", tables)).await)["checks"]["n"],
        json!([[0]])
    );
}

#[tokio::test]
async fn compensate_without_undo_sql_does_nothing() {
    let mut req = request("create", create());
    req.action = Action::Compensate;
    let ev = evidence(SqliteSandbox::new().execute(req).await);
    assert_eq!(ev["statements"], 0);
    assert_eq!(ev["compensated"], true);
}

#[tokio::test]
async fn foreign_keys_are_enforced() {
    let payload = json!({
        "sql": ["CREATE TABLE p (id INTEGER PRIMARY KEY)",
                "CREATE TABLE c (p_id INTEGER REFERENCES p(id))",
                "INSERT INTO c VALUES (7)"],
        "checks": [],
    });
    let message = permanent(SqliteSandbox::new().execute(request("fk", payload)).await);
    assert_eq!(
        message,
        "step fk: statement sql[2] failed: FOREIGN KEY constraint failed"
    );
}

#[tokio::test]
async fn a_delay_sleeps_before_running() {
    let started = tokio::time::Instant::now();
    let payload = json!({"sql": [], "checks": [], "delay_ms": 1});
    evidence(SqliteSandbox::new().execute(request("slow", payload)).await);
    assert!(started.elapsed() >= std::time::Duration::from_millis(1));
}

#[tokio::test]
async fn nothing_outside_the_sandbox_database_can_be_reached() {
    let dir = tempfile::tempdir().unwrap();
    let host = |name: &str| dir.path().join(name).display().to_string();
    let attacks = [
        format!("ATTACH DATABASE '{}' AS x", host("attached.db")),
        format!("ATTACH DATABASE 'file:{}?mode=rwc' AS x", host("uri.db")),
        format!("VACUUM INTO '{}'", host("vacuumed.db")),
        format!("PRAGMA temp_store_directory = '{}'", host("")),
        "PRAGMA writable_schema = ON".to_owned(),
        "PRAGMA foreign_keys = OFF".to_owned(),
        "PRAGMA hard_heap_limit = 0".to_owned(),
        "PRAGMA soft_heap_limit = 0".to_owned(),
        "SELECT load_extension('/tmp/evil')".to_owned(),
        "DETACH DATABASE temp".to_owned(),
    ];
    for (i, sql) in attacks.iter().enumerate() {
        let sandbox = SqliteSandbox::new();
        let payload = json!({"sql": ["CREATE TABLE t (x)", sql], "checks": []});
        let message = permanent(sandbox.execute(request(&format!("s{i}"), payload)).await);
        assert!(
            message.starts_with(&format!("step s{i}: statement sql[1] failed:")),
            "{sql}: {message}"
        );
    }
    let created: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(created.is_empty(), "host files were created: {created:?}");
}

#[tokio::test]
async fn checks_cannot_write_attach_or_change_settings() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("check.db").display().to_string();
    let sandbox = SqliteSandbox::new();
    evidence(sandbox.execute(request("seed", create())).await);
    let queries = [
        format!("ATTACH DATABASE '{file}' AS x"),
        "PRAGMA user_version = 7".to_owned(),
        "BEGIN".to_owned(),
        "CREATE TABLE u (x)".to_owned(),
        "DELETE FROM t".to_owned(),
        "DELETE FROM t RETURNING id".to_owned(),
    ];
    for (i, query) in queries.iter().enumerate() {
        let payload = json!({"sql": [], "checks": [{"name": "c", "query": query}]});
        let message = permanent(sandbox.execute(request(&format!("c{i}"), payload)).await);
        assert!(
            message.starts_with(&format!("step c{i}: check checks[0] (c) failed")),
            "{query}: {message}"
        );
    }
    assert!(!std::path::Path::new(&file).exists());
    let count = json!({"sql": [], "checks": [{"name": "n", "query": "SELECT count(*) FROM t"}]});
    assert_eq!(
        evidence(sandbox.execute(request("n", count)).await)["checks"]["n"],
        json!([[2]])
    );
    // The step's own SQL may still write after a check ran.
    let write = json!({"sql": ["INSERT INTO t (id) VALUES (3)"], "checks": []});
    evidence(sandbox.execute(request("w", write)).await);
}

#[tokio::test]
async fn evidence_is_capped_by_rows_and_bytes() {
    let sandbox = SqliteSandbox::new();
    let rows = json!({"sql": [], "checks": [{"name": "many", "query":
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 1001) SELECT i FROM n"}]});
    let message = permanent(sandbox.execute(request("rows", rows)).await);
    assert!(
        message.ends_with("answers more than 1000 rows (the limit per check)"),
        "{message}"
    );
    let bytes = json!({"sql": [], "checks": [{"name": "big", "query":
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 300) SELECT zeroblob(1000) FROM n"}]});
    let message = permanent(sandbox.execute(request("bytes", bytes)).await);
    assert!(message.contains("exceed 262144 bytes of evidence"), "{message}");
    let huge = json!({"sql": ["SELECT zeroblob(2000000)"], "checks": []});
    let message = permanent(sandbox.execute(request("huge", huge)).await);
    assert!(message.contains("too big"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_runaway_step_stops_its_sql() {
    let sandbox = SqliteSandbox::new();
    let runaway = json!({"sql": ["WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"], "checks": []});
    let budget = std::time::Duration::from_millis(200);
    let outcome = tokio::time::timeout(budget, sandbox.execute(request("runaway", runaway))).await;
    assert!(outcome.is_err(), "a query that never ends ended: {outcome:?}");
    // The next step of the same delivery needs the sandbox the runaway held: it
    // runs only once the runaway's SQL was interrupted.
    let next = json!({"sql": [], "checks": [{"name": "one", "query": "SELECT 1"}]});
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        sandbox.execute(request("next", next)),
    )
    .await
    .expect("the runaway step still holds the sandbox");
    assert_eq!(evidence(answer)["checks"]["one"], json!([[1]]));
}
