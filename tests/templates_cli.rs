//! A template as a user writes and runs it: a TOML plan with `[input]` and
//! `$input` references, `enqueue --input` inline or from a file, `--order-key`,
//! and the errors of bad input and bad references (exit 2, naming the field,
//! nothing written).

mod cli_support;

use cli_support::Db;
use serde_json::{json, Value};

const TEMPLATE: &str = r#"
name = "orders"
recovery = "resume"
on_failure = "block"

[input]
order = { type = "integer", required = true }
note = { type = "string", max_bytes = 32 }

[[steps]]
code = "ship"
executor = "dry-run:v1"
payload = { order = { "$input" = "/order" }, note = { "$input" = "/note" } }
"#;

fn add_template(db: &Db, text: &str) -> std::process::Output {
    let path = db.path("orders.toml");
    std::fs::write(&path, text).unwrap();
    db.run(&["plan", "add", path.to_str().unwrap()])
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn history(db: &Db) -> Vec<Value> {
    let text = db.ok(&["history", "orders", "--json"]);
    serde_json::from_str::<Value>(&text)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn a_template_runs_each_attempt_with_its_own_input_frozen_on_its_receipts() {
    let db = Db::new();
    assert!(add_template(&db, TEMPLATE).status.success());
    let shown = db.ok(&["plan", "show", "orders"]);
    assert!(
        shown.contains("order (integer, required)") && shown.contains("on failure  block"),
        "{shown}"
    );
    let first: Value =
        serde_json::from_str(&db.ok(&["enqueue", "orders", "--input", r#"{"order": 7}"#, "--json"])).unwrap();
    let file = db.path("input.json");
    std::fs::write(&file, r#"{"order": 8, "note": "fragile"}"#).unwrap();
    let input_arg = format!("@{}", file.display());
    let second: Value = serde_json::from_str(&db.ok(&["enqueue", "orders", "--input", &input_arg, "--json"])).unwrap();
    assert_eq!(first["created"], true);
    assert_eq!(first["receipts"][0]["payload"], r#"{"note":null,"order":7}"#);
    assert_eq!(second["receipts"][0]["payload"], r#"{"note":"fragile","order":8}"#);
    assert_eq!(second["attempt"]["input"], r#"{"note":"fragile","order":8}"#);
    db.ok(&["worker", "--until-idle"]);
    let ended = history(&db);
    assert_eq!(ended.len(), 2);
    assert!(ended.iter().all(|r| r["attempt"]["status"] == "SUCCEEDED"), "{ended:?}");
    let shown = db.ok(&["status", second["attempt_id"].as_str().unwrap()]);
    assert!(shown.contains(r#"input       {"note":"fragile","order":8}"#), "{shown}");
}

#[test]
fn an_order_key_makes_the_next_attempt_wait_for_the_one_ahead() {
    let db = Db::new();
    assert!(add_template(&db, TEMPLATE).status.success());
    let enqueue = |order: u32| {
        let input = json!({"order": order}).to_string();
        db.run(&[
            "enqueue",
            "orders",
            "--input",
            &input,
            "--order-key",
            "customer-1",
            "--json",
        ])
    };
    let first = enqueue(1);
    assert!(first.status.success(), "{}", stderr(&first));
    let second = enqueue(2);
    assert!(stderr(&second).contains("waits for the attempts ahead of it on order key \"customer-1\""));
    let second: Value = serde_json::from_slice(&second.stdout).unwrap();
    assert_eq!(second["command"]["status"], "WAITING");
    assert_eq!(second["attempt"]["order_key"], "customer-1");
    let shown = db.ok(&["status", second["attempt_id"].as_str().unwrap()]);
    assert!(
        shown.contains("waits for       the attempts ahead of it on its order key"),
        "{shown}"
    );
    db.ok(&["worker", "--until-idle"]);
    let ended = history(&db);
    assert!(ended.iter().all(|r| r["attempt"]["status"] == "SUCCEEDED"), "{ended:?}");
    let at = |r: &Value, field: &str| r["attempt"][field].as_i64().unwrap();
    assert!(
        at(&ended[1], "started_at") >= at(&ended[0], "finished_at"),
        "one at a time, in enqueue order: {ended:?}"
    );
}

#[test]
fn bad_input_exits_2_naming_the_field_and_enqueues_nothing() {
    let db = Db::new();
    assert!(add_template(&db, TEMPLATE).status.success());
    let long_note = json!({"order": 1, "note": "n".repeat(40)}).to_string();
    let missing = db.path("missing.json");
    let missing_arg = format!("@{}", missing.display());
    for (args, says) in [
        (vec!["--input", r#"{"note": "x"}"#], "input.order: is required"),
        (
            vec!["--input", r#"{"order": "7"}"#],
            "input.order: expected integer, found string",
        ),
        (
            vec!["--input", &long_note],
            "input.note: 42 bytes exceeds its max_bytes of 32",
        ),
        (vec!["--input", "{order: 7"], "--input"),
        (vec!["--input", &missing_arg], "--input"),
        (vec!["--input", r#"{"order": 1}"#, "--order-key", ""], "--order-key"),
    ] {
        let out = db.run(&[&["enqueue", "orders"], &args[..]].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    assert!(history(&db).is_empty(), "nothing was enqueued");
}

#[test]
fn a_reference_to_an_undeclared_field_is_refused_at_registration() {
    let db = Db::new();
    let bad = TEMPLATE.replace(r#""$input" = "/note""#, r#""$input" = "/customer""#);
    let out = add_template(&db, &bad);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("steps[0].payload.note") && stderr(&out).contains("\"/customer\" names no field"),
        "{}",
        stderr(&out)
    );
    let plans = db.ok(&["plan", "list"]);
    assert!(!plans.contains("orders"), "{plans}");
}

/// Ten thousand orders, each with its own input, through one template: one plan
/// registered, every attempt delivered with the payload its input resolved.
#[test]
fn ten_thousand_inputs_deliver_through_one_template() {
    use leasehold::clock::SystemClock;
    use leasehold::engine::{Action, AttemptStatus};
    use leasehold::entropy::OsEntropy;
    use leasehold::ledger::sqlite::SqliteLedger;
    use leasehold::ledger::{EnqueueRequest, Ledger};
    use std::sync::Arc;
    const ORDERS: u64 = 10_000;
    let db = Db::new();
    assert!(add_template(&db, TEMPLATE).status.success());
    let path = db.path("ledger.db");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ledger = SqliteLedger::open(path.to_str().unwrap(), Arc::new(SystemClock), Arc::new(OsEntropy)).unwrap();
    let plan = runtime.block_on(ledger.plans_named("orders")).unwrap().remove(0);
    for order in 0..ORDERS {
        let request = EnqueueRequest::new(Action::Execute).with_input(Some(json!({"order": order})));
        runtime.block_on(ledger.enqueue_with(&plan.id, request)).unwrap();
    }
    db.ok(&["worker", "--until-idle", "--batch", "32"]);
    let history = runtime.block_on(ledger.history(&plan.id)).unwrap();
    assert_eq!(history.len() as u64, ORDERS);
    assert!(history.iter().all(|r| r.attempt.status == AttemptStatus::Succeeded));
    let mut orders: Vec<u64> = history
        .iter()
        .map(|r| {
            let payload: Value = serde_json::from_str(r.receipts[0].payload.as_deref().unwrap()).unwrap();
            payload["order"].as_u64().unwrap()
        })
        .collect();
    orders.sort_unstable();
    assert_eq!(
        orders,
        (0..ORDERS).collect::<Vec<_>>(),
        "each order delivered with its own input"
    );
    assert_eq!(
        runtime.block_on(ledger.list_plans()).unwrap().len(),
        1,
        "one plan registered"
    );
}
