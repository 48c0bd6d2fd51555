//! Plan validation at its limits (each limit admitted, one past it refused, naming
//! the field), and the model helpers plans and commands are read through.

use leasehold_engine::plan::{MAX_PAYLOAD_BYTES, MAX_PLAN_FILE_BYTES, MAX_STEPS, MAX_VOLATILE_FIELDS};
use leasehold_engine::{CommandStatus, Plan, PlanError, PlanId, PlanSpec, Timestamp};
use serde_json::{json, Value};

const EXECUTORS: &[&str] = &["dry-run:v1"];

fn spec(steps: usize, volatile_fields: usize, payload: Value) -> PlanSpec {
    serde_json::from_value(json!({
        "name": "limits",
        "recovery": "resume",
        "volatile_fields": (0..volatile_fields).map(|i| format!("f{i}")).collect::<Vec<_>>(),
        "steps": (0..steps)
            .map(|i| json!({"code": format!("s{i}"), "executor": "dry-run:v1", "payload": payload}))
            .collect::<Vec<_>>(),
    }))
    .expect("a well-formed spec")
}

fn build(spec: PlanSpec) -> Result<Plan, PlanError> {
    spec.into_plan(EXECUTORS, PlanId::new("pln-1"), Timestamp::from_millis(0))
}

#[test]
fn the_most_steps_are_admitted_and_one_more_is_refused() {
    assert_eq!(build(spec(MAX_STEPS, 0, json!({}))).unwrap().steps.len(), MAX_STEPS);
    assert_eq!(
        build(spec(MAX_STEPS + 1, 0, json!({}))),
        Err(PlanError::TooMany {
            field: "steps",
            count: MAX_STEPS + 1,
            max: MAX_STEPS
        })
    );
}

#[test]
fn the_most_volatile_fields_are_admitted_and_one_more_is_refused() {
    let plan = build(spec(1, MAX_VOLATILE_FIELDS, json!({}))).unwrap();
    assert_eq!(plan.volatile_fields.len(), MAX_VOLATILE_FIELDS);
    assert_eq!(
        build(spec(1, MAX_VOLATILE_FIELDS + 1, json!({}))),
        Err(PlanError::TooMany {
            field: "volatile_fields",
            count: MAX_VOLATILE_FIELDS + 1,
            max: MAX_VOLATILE_FIELDS
        })
    );
}

#[test]
fn a_payload_of_exactly_the_largest_size_is_admitted_and_one_byte_more_is_refused() {
    // `{"p":"…"}` is 8 bytes around the string.
    let exact = json!({"p": "x".repeat(MAX_PAYLOAD_BYTES - 8)});
    assert_eq!(
        leasehold_engine::canonical::canonical_json(&exact).len(),
        MAX_PAYLOAD_BYTES
    );
    assert!(build(spec(1, 0, exact)).is_ok());
    let over = json!({"p": "x".repeat(MAX_PAYLOAD_BYTES - 7)});
    assert_eq!(
        build(spec(1, 0, over)),
        Err(PlanError::PayloadTooLarge {
            index: 0,
            bytes: MAX_PAYLOAD_BYTES + 1
        })
    );
}

#[test]
fn the_plan_file_limit_is_the_documented_four_mebibytes() {
    // README and docs/security.md promise plan files are read up to 4 MiB.
    assert_eq!(MAX_PLAN_FILE_BYTES, 4_194_304);
}

#[test]
fn a_step_without_a_payload_gets_an_empty_object() {
    let spec: PlanSpec = serde_json::from_value(json!({
        "name": "p",
        "recovery": "resume",
        "steps": [{"code": "a", "executor": "dry-run:v1"}],
    }))
    .unwrap();
    assert_eq!(spec.steps[0].payload, json!({}));
}

#[test]
fn a_plan_finds_its_steps_by_code() {
    let plan = build(spec(3, 0, json!({}))).unwrap();
    assert_eq!(plan.step("s1").map(|s| s.code.as_str()), Some("s1"));
    assert_eq!(plan.step("s2").map(|s| s.code.as_str()), Some("s2"));
    assert!(plan.step("nope").is_none());
}

#[test]
fn delivered_failed_and_aborted_commands_are_terminal_and_the_others_are_not() {
    for (status, terminal) in [
        (CommandStatus::Pending, false),
        (CommandStatus::Processing, false),
        (CommandStatus::Delivered, true),
        (CommandStatus::Failed, true),
        (CommandStatus::Aborted, true),
    ] {
        assert_eq!(status.is_terminal(), terminal, "{status}");
    }
}

#[test]
fn a_name_of_the_most_characters_is_admitted_and_one_more_is_refused() {
    use leasehold_engine::plan::MAX_NAME_CHARS;
    let named = |name: String| {
        let mut s = spec(1, 0, json!({}));
        s.name = name;
        build(s)
    };
    // Characters, not bytes: a multi-byte name of exactly the limit is admitted.
    assert!(named("é".repeat(MAX_NAME_CHARS)).is_ok());
    assert_eq!(
        named("é".repeat(MAX_NAME_CHARS + 1)),
        Err(PlanError::TooLong {
            field: "name".to_owned(),
            chars: MAX_NAME_CHARS + 1
        })
    );
}
