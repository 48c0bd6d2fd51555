//! Templates and ordered keys: a plan's `[input]`, the payloads an enqueue freezes,
//! and what happens behind an order key's head when it ends.

mod common;

use common::*;
use leasehold_engine::input::prepare;
use leasehold_engine::order::{after_end, ends_head};
use leasehold_engine::transition::{self, abort, Start, TemplateEnqueue};
use leasehold_engine::{AttemptRecord, AttemptStatus, CommandStatus, Plan, PlanError, PlanId, PlanSpec};
use serde_json::{json, Value};

fn spec(on_failure: Option<&str>) -> Value {
    let mut spec = json!({
        "name": "grants",
        "recovery": "resume",
        "input": {"user": {"type": "string", "required": true}, "role": {"type": "string"}},
        "steps": [
            {"code": "grant", "executor": EXECUTOR, "payload": {"who": {"$input": "/user"}, "as": {"$input": "/role"}}},
            {"code": "notify", "executor": EXECUTOR, "payload": {"fixed": true}},
        ],
    });
    if let Some(rule) = on_failure {
        spec["on_failure"] = json!(rule);
    }
    spec
}

fn register(spec: Value) -> Result<Plan, PlanError> {
    let spec: PlanSpec = serde_json::from_value(spec).expect("a plan spec");
    spec.into_plan(&[EXECUTOR], PlanId::new("pln-t"), at(REGISTERED_MS))
}

fn template(on_failure: Option<&str>) -> Plan {
    register(spec(on_failure)).expect("a valid template")
}

/// Attempt `n` of the template with `input` on `order_key`, behind `ahead`.
fn enqueue(plan: &Plan, n: u32, input: Value, order_key: Option<&str>, ahead: Option<&AttemptRecord>) -> AttemptRecord {
    let prepared = prepare(plan, &input).expect("valid input");
    let t = TemplateEnqueue {
        input: &prepared,
        order_key,
        latest_number: n - 1,
        ahead,
    };
    allowed(transition::enqueue_template(
        plan,
        t,
        ids(n),
        at(ENQUEUED_MS),
        Start::Now,
    ))
}

fn ended(record: &AttemptRecord, status: AttemptStatus) -> AttemptRecord {
    let mut r = record.clone();
    r.attempt.status = status;
    r.attempt.finished_at = Some(at(CLAIMED_MS));
    r.command.status = match status {
        AttemptStatus::Succeeded => CommandStatus::Delivered,
        AttemptStatus::Failed => CommandStatus::Failed,
        _ => CommandStatus::Aborted,
    };
    r
}

#[test]
fn a_template_freezes_each_steps_resolved_payload_and_its_input_fingerprint() {
    let plan = template(None);
    let record = enqueue(&plan, 1, json!({"user": "ada"}), None, None);
    let payload = |o: u32| record.receipt(o).and_then(|r| r.payload.clone());
    assert_eq!(payload(1).as_deref(), Some(r#"{"as":null,"who":"ada"}"#));
    assert_eq!(payload(2).as_deref(), Some(r#"{"fixed":true}"#));
    assert_eq!(record.attempt.input.as_deref(), Some(r#"{"user":"ada"}"#));
    let sha = leasehold_engine::canonical::sha256_hex(br#"{"user":"ada"}"#);
    assert_eq!(record.attempt.input_sha256, Some(sha));
    assert_eq!(record.command.status, CommandStatus::Pending);
    let step = AttemptRecord::step_of(&plan, &record.receipts[0]).expect("the step");
    assert_eq!(step.payload, json!({"who": "ada", "as": null}));
    // The template itself is unchanged, and its fingerprint is the template's.
    assert_eq!(plan.steps[0].payload["who"], json!({"$input": "/user"}));
    leasehold_engine::plan::verify_fingerprint(&plan).unwrap();
}

#[test]
fn registration_refuses_unknown_pointers_and_misplaced_rules() {
    let mut unknown = spec(None);
    unknown["steps"][0]["payload"]["who"] = json!({"$input": "/customer"});
    let e = register(unknown).unwrap_err().to_string();
    assert!(
        e.starts_with("steps[0].payload.who:") && e.contains("names no field"),
        "{e}"
    );
    let mut without_input = spec(None);
    without_input.as_object_mut().unwrap().remove("input");
    let e = register(without_input.clone()).unwrap_err().to_string();
    assert!(e.contains("declares no [input]"), "{e}");
    without_input["steps"][0]["payload"] = json!({});
    without_input["on_failure"] = json!("continue");
    let e = register(without_input).unwrap_err().to_string();
    assert!(e.starts_with("on_failure:"), "{e}");
    let e = register(spec(Some("skip"))).unwrap_err().to_string();
    assert!(e.starts_with("on_failure:") && e.contains("block or continue"), "{e}");
}

#[test]
fn the_input_table_and_the_rule_count_in_the_fingerprint() {
    let block = template(None);
    let cont = template(Some("continue"));
    assert_ne!(block.fingerprint, cont.fingerprint);
    let mut wider = spec(None);
    wider["input"]["note"] = json!({"type": "string"});
    assert_ne!(register(wider).unwrap().fingerprint, block.fingerprint);
}

#[test]
fn a_template_takes_only_execute_attempts() {
    let plan = template(None);
    let refusal = refused(transition::enqueue(
        &plan,
        &[],
        leasehold_engine::Action::Execute,
        ids(1),
        at(1),
    ));
    assert!(refusal.to_string().contains("is a template"), "{refusal}");
    let refusal = refused(transition::enqueue(
        &plan,
        &[],
        leasehold_engine::Action::Retry,
        ids(1),
        at(1),
    ));
    assert!(refusal.to_string().contains("is a template"), "{refusal}");
}

#[test]
fn behind_an_open_attempt_on_its_key_an_attempt_waits() {
    let plan = template(None);
    let head = enqueue(&plan, 1, json!({"user": "ada"}), Some("ada"), None);
    let next = enqueue(&plan, 2, json!({"user": "ada"}), Some("ada"), Some(&head));
    assert_eq!(next.command.status, CommandStatus::Waiting);
    assert_eq!(next.attempt.status, AttemptStatus::Queued);
    let other_key = enqueue(&plan, 3, json!({"user": "bob"}), Some("bob"), None);
    assert_eq!(other_key.command.status, CommandStatus::Pending);
    let no_key = enqueue(&plan, 4, json!({"user": "ada"}), None, Some(&head));
    assert_eq!(
        no_key.command.status,
        CommandStatus::Pending,
        "without a key, attempts run side by side"
    );
    let after_end = enqueue(
        &plan,
        5,
        json!({"user": "ada"}),
        Some("ada"),
        Some(&ended(&head, AttemptStatus::Succeeded)),
    );
    assert_eq!(after_end.command.status, CommandStatus::Pending);
}

#[test]
fn a_head_that_succeeds_releases_the_earliest_waiting_attempt_only() {
    let plan = template(None);
    let head = enqueue(&plan, 1, json!({"user": "ada"}), Some("ada"), None);
    let second = enqueue(&plan, 2, json!({"user": "ada"}), Some("ada"), Some(&head));
    let third = enqueue(&plan, 3, json!({"user": "ada"}), Some("ada"), Some(&head));
    let done = ended(&head, AttemptStatus::Succeeded);
    assert!(ends_head(&head, &done));
    let writes = after_end(&plan, &done, &[third.clone(), second.clone()], at(CLAIMED_MS));
    assert_eq!(writes.len(), 1);
    let released = applied(&second, &writes[0]);
    assert_eq!(released.command.status, CommandStatus::Pending);
    assert_eq!(released.command.available_at, at(CLAIMED_MS));
    assert!(writes[0].guard.admits(Some(&second.command)));
    assert!(
        !writes[0].guard.admits(Some(&released.command)),
        "a release applies once"
    );
}

#[test]
fn a_failed_head_blocks_every_waiting_attempt_unless_the_plan_continues() {
    for (rule, blocked) in [(None, true), (Some("block"), true), (Some("continue"), false)] {
        let plan = template(rule);
        let head = enqueue(&plan, 1, json!({"user": "ada"}), Some("ada"), None);
        let waiting = [
            enqueue(&plan, 2, json!({"user": "ada"}), Some("ada"), Some(&head)),
            enqueue(&plan, 3, json!({"user": "ada"}), Some("ada"), Some(&head)),
        ];
        let failed = ended(&head, AttemptStatus::Failed);
        let writes = after_end(&plan, &failed, &waiting, at(CLAIMED_MS));
        if blocked {
            assert_eq!(writes.len(), 2, "{rule:?}");
            for (w, r) in writes.iter().zip(&waiting) {
                let after = applied(r, w);
                assert_eq!(after.attempt.status, AttemptStatus::Aborted);
                assert!(
                    after.attempt.error.as_deref().unwrap_or_default().contains("blocked"),
                    "{rule:?}"
                );
            }
        } else {
            assert_eq!(writes.len(), 1);
            assert_eq!(applied(&waiting[0], &writes[0]).command.status, CommandStatus::Pending);
        }
    }
}

#[test]
fn aborting_a_waiting_attempt_leaves_the_head_and_the_rest_alone() {
    let plan = template(None);
    let head = enqueue(&plan, 1, json!({"user": "ada"}), Some("ada"), None);
    let waiting = enqueue(&plan, 2, json!({"user": "ada"}), Some("ada"), Some(&head));
    let writes = allowed(abort(&waiting, "not needed", at(CLAIMED_MS)));
    let aborted = applied(&waiting, &writes);
    assert_eq!(aborted.attempt.status, AttemptStatus::Aborted);
    assert_eq!(aborted.command.status, CommandStatus::Aborted);
    assert!(!ends_head(&waiting, &aborted), "a waiting attempt is not the head");
}
