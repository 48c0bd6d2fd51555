//! The plan fixtures under `scenarios/plans/` parse, validate against the known
//! executors, and (for the rehearsal) run green through the sandbox executor.

use leasehold::executor::{ExecRequest, Executor, ExecutorResult, Executors, SqliteSandbox};
use leasehold_engine::plan::idempotency_key;
use leasehold_engine::{Action, AttemptId, CommandId, Plan, PlanId, PlanSpec, Recovery, Timestamp};
use serde_json::{json, Value};
use std::path::PathBuf;

fn load(name: &str) -> Plan {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios/plans")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let spec: PlanSpec = toml::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()));
    spec.into_plan(&Executors::new().names(), PlanId::new(name), Timestamp::from_millis(0))
        .unwrap_or_else(|e| panic!("validate {}: {e}", path.display()))
}

#[test]
fn rehearsal_is_a_six_step_replay_plan_on_the_sandbox() {
    let plan = load("rehearsal.toml");
    assert_eq!(plan.name, "rehearsal");
    assert_eq!(plan.recovery, Recovery::Replay);
    assert_eq!(plan.volatile_fields, ["sandbox_id"]);
    let codes: Vec<&str> = plan.steps.iter().map(|s| s.code.as_str()).collect();
    assert_eq!(
        codes,
        [
            "create-schema",
            "seed-reference-data",
            "migrate",
            "grant-permissions",
            "register-menu-entries",
            "verify-integrity"
        ]
    );
    for step in &plan.steps {
        assert_eq!(step.executor, "sqlite-sandbox:v1", "{}", step.code);
        assert_eq!(step.payload["delay_ms"], 300, "{}", step.code);
        // Checks are an array of inline tables.
        let checks = step.payload["checks"].as_array().expect("checks is an array");
        assert!(!checks.is_empty(), "{} has no checks", step.code);
        assert!(checks.iter().all(|c| c["name"].is_string() && c["query"].is_string()));
    }
}

#[test]
fn dry_run_is_a_slow_five_step_resume_plan() {
    let plan = load("dry-run.toml");
    assert_eq!(plan.name, "dry-run");
    assert_eq!(plan.recovery, Recovery::Resume);
    assert_eq!(plan.steps.len(), 5);
    for step in &plan.steps {
        assert_eq!(step.executor, "dry-run:v1", "{}", step.code);
        assert_eq!(step.payload["delay_ms"], 800, "{}", step.code);
    }
}

async fn run_rehearsal(sandbox: &SqliteSandbox, plan: &Plan, attempt: &AttemptId, delivery: u32) -> Vec<Value> {
    let mut evidence = Vec::new();
    for (index, step) in plan.steps.iter().enumerate() {
        let ordinal = u32::try_from(index + 1).expect("six steps");
        let request = ExecRequest {
            plan_id: plan.id.clone(),
            attempt_id: attempt.clone(),
            command_id: CommandId::new("cmd-1"),
            delivery,
            action: Action::Execute,
            ordinal,
            step: step.clone(),
            idempotency_key: idempotency_key(attempt, ordinal, &step.code),
            traceparent: None,
        };
        match sandbox.execute(request).await {
            ExecutorResult::Done { evidence: e, .. } => evidence.push(e),
            other => panic!("step {} did not succeed: {other:?}", step.code),
        }
    }
    evidence
}

#[tokio::test]
async fn every_rehearsal_step_succeeds_in_one_sandbox_and_integrity_is_ok() {
    let plan = load("rehearsal.toml");
    let sandbox = SqliteSandbox::new();
    let attempt = AttemptId::new("att-1");
    let evidence = run_rehearsal(&sandbox, &plan, &attempt, 1).await;
    assert_eq!(evidence.len(), 6);
    assert!(evidence.iter().all(|e| e["sandbox_id"] == "sbx-att-1-d1"));

    let verify = &evidence[5]["checks"];
    assert_eq!(verify["integrity"], json!([["ok"]]));
    assert_eq!(verify["foreign_key_violations"], json!([]));
    assert_eq!(verify["schema_version"], json!([[2]]));
    assert_eq!(
        verify["row_counts"],
        json!([
            ["account", 4],
            ["account_role", 4],
            ["country", 4],
            ["menu_entry", 5],
            ["permission", 4],
            ["plan_tier", 3],
            ["project", 4],
            ["project_member", 5],
            ["role", 3],
            ["role_permission", 7]
        ])
    );
    assert_eq!(evidence[2]["checks"]["accounts_without_tier"], json!([[0]]));
    assert_eq!(evidence[3]["checks"]["accounts_without_role"], json!([]));

    sandbox.release(&attempt, 1);
    assert!(sandbox.open_sandboxes().is_empty());
}
