//! `leasehold enqueue --key` as a script runs it: run again after a timeout or a
//! crash, the same command answers the attempt the first run created and enqueues
//! nothing; the same key with another request exits 2 naming the attempt; a key that
//! is not one exits 2 naming the flag.

mod cli_support;

use cli_support::Db;
use serde_json::{json, Value};

fn enqueue(db: &Db, args: &[&str]) -> Value {
    serde_json::from_str(&db.ok(&[&["enqueue"], args, &["--json"]].concat())).unwrap()
}

#[test]
fn the_same_key_and_request_answer_the_first_attempt_and_enqueue_nothing() {
    let db = Db::new();
    let plan = db.add_plan_file(
        "push.json",
        &json!({"name": "push", "recovery": "resume", "steps": [{"code": "one", "executor": "dry-run:v1"}]}),
    );
    let first = enqueue(&db, &[&plan, "--key", "order-42"]);
    assert_eq!(first["created"], true, "{first}");
    assert_eq!(first["attempt_id"], first["attempt"]["id"]);
    assert_eq!(first["attempt"]["enqueue_key"], "order-42");
    let again = enqueue(&db, &[&plan, "--key", "order-42"]);
    assert_eq!(
        (again["created"].clone(), again["attempt_id"].clone()),
        (json!(false), first["attempt_id"].clone())
    );
    let text = db.run(&["enqueue", &plan, "--key", "order-42"]);
    assert!(text.status.success());
    assert_eq!(
        String::from_utf8_lossy(&text.stdout).trim(),
        first["attempt_id"].as_str().unwrap()
    );
    assert!(String::from_utf8_lossy(&text.stderr).contains("enqueued earlier with this key"));
    let history: Value = serde_json::from_str(&db.ok(&["history", &plan, "--json"])).unwrap();
    assert_eq!(history.as_array().unwrap().len(), 1, "one attempt: {history}");
    db.ok(&["worker", "--until-idle"]);
    let after = enqueue(&db, &[&plan, "--key", "order-42"]);
    assert_eq!(
        (after["created"].clone(), after["attempt"]["status"].clone()),
        (json!(false), json!("SUCCEEDED"))
    );
}

#[test]
fn another_request_with_the_key_or_a_bad_key_exits_2_and_enqueues_nothing() {
    let db = Db::new();
    let plan = db.add_plan_file(
        "push.json",
        &json!({"name": "push", "recovery": "resume", "steps": [{"code": "one", "executor": "dry-run:v1"}]}),
    );
    let first = enqueue(&db, &[&plan, "--key", "k1", "--in", "10m"]);
    let other = db.run(&["enqueue", &plan, "--key", "k1", "--in", "20m"]);
    assert_eq!(other.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(
        stderr.contains("\"k1\" was used by another request") && stderr.contains(first["attempt_id"].as_str().unwrap()),
        "{stderr}"
    );
    for bad in [String::new(), "k".repeat(256)] {
        let out = db.run(&["enqueue", &plan, "--key", &bad]);
        assert_eq!(out.status.code(), Some(2));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--key"),
            "{:?}",
            out.stderr
        );
    }
    let history: Value = serde_json::from_str(&db.ok(&["history", &plan, "--json"])).unwrap();
    assert_eq!(history.as_array().unwrap().len(), 1, "{history}");
}
