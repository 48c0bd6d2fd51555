//! Routing: every step's target, the command's route following the next step, and
//! claims refused to a worker that cannot run the step they would begin.

mod common;

use common::*;
use leasehold_engine::route::{Reach, DEFAULT_QUEUE};
use leasehold_engine::{
    decide, AttemptRecord, Capabilities, ClaimRequest, Plan, PlanId, PlanSpec, Refusal, Request, WorkerRequest,
};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

const CRM: &str = "acme-crm:v1";
const HTTP: &str = "http:v1";
const HOOK: &str = "http://hooks.example:8080";

/// A two-step plan: the CRM (target `crm-eu`), then a webhook over `http:v1`.
fn spec(recovery: &str, queue: Option<&str>) -> Value {
    let mut spec = json!({
        "name": "routed",
        "recovery": recovery,
        "steps": [
            {"code": "upsert", "executor": CRM, "target": "crm-eu"},
            {"code": "notify", "executor": HTTP, "payload": {"url": "http://Hooks.example:8080/v1/x"}},
        ],
    });
    if let Some(q) = queue {
        spec["queue"] = json!(q);
    }
    spec
}

fn build(spec: Value) -> Result<Plan, String> {
    let spec: PlanSpec = serde_json::from_value(spec).map_err(|e| e.to_string())?;
    spec.into_plan(&[CRM, HTTP], PlanId::new("plan-1"), at(REGISTERED_MS))
        .map_err(|e| e.to_string())
}

fn routed(recovery: &str) -> Plan {
    build(spec(recovery, Some("billing"))).expect("the plan is valid")
}

/// A worker running `crm` (any target) and `http:v1` to `hosts`, taking `queue`.
fn worker(crm: bool, hosts: &[&str], queue: &str) -> Capabilities {
    let mut executors = BTreeMap::new();
    if crm {
        executors.insert(CRM.to_owned(), Reach::Any);
    }
    executors.insert(
        HTTP.to_owned(),
        Reach::Only(hosts.iter().map(|h| (*h).to_owned()).collect()),
    );
    Capabilities {
        executors,
        queues: BTreeSet::from([queue.to_owned()]),
    }
}

fn claim(record: &AttemptRecord, plan: &Plan, caps: Capabilities, now_ms: i64) -> Result<AttemptRecord, Refusal> {
    let request = ClaimRequest {
        owner: OWNER_B.into(),
        batch: 1,
        lease_ms: LEASE_MS,
        begin: true,
        capabilities: Some(caps),
    };
    let token = token_b();
    decide(record, Request::Claim(&request, &token, plan), at(now_ms)).map(|(w, _)| applied(record, &w))
}

#[test]
fn an_enqueue_records_each_steps_route_and_the_command_carries_the_first() {
    let plan = routed("resume");
    let record = enqueued(&plan);
    let routes: Vec<(&str, &str)> = record
        .receipts
        .iter()
        .map(|r| (r.executor.as_str(), r.target.as_str()))
        .collect();
    assert_eq!(routes, [(CRM, "crm-eu"), (HTTP, HOOK)]);
    let c = &record.command;
    assert_eq!(
        (c.queue.as_str(), c.executor.as_str(), c.target.as_str()),
        ("billing", CRM, "crm-eu")
    );
    assert!(worker(true, &[], "billing").admits(c));
    assert!(!worker(false, &[HOOK], "billing").admits(c));
    assert!(!worker(true, &[], DEFAULT_QUEUE).admits(c));
}

#[test]
fn a_claim_by_a_worker_that_cannot_run_the_step_is_refused_naming_why() {
    let plan = routed("resume");
    let record = enqueued(&plan);
    let why = |caps| match claim(&record, &plan, caps, CLAIMED_MS) {
        Err(Refusal::CannotRun { reason, .. }) => reason,
        other => panic!("expected CannotRun, got {other:?}"),
    };
    assert_eq!(why(worker(false, &[HOOK], "billing")), "it has no executor acme-crm:v1");
    assert_eq!(
        why(worker(true, &[], DEFAULT_QUEUE)),
        "it takes no work of queue billing"
    );
    let taken = claim(&record, &plan, worker(true, &[], "billing"), CLAIMED_MS).expect("a capable worker claims");
    assert_eq!(taken.command.lease_owner.as_deref(), Some(OWNER_B));
}

#[test]
fn the_command_follows_the_next_step_and_a_replay_takeover_goes_back_to_the_first() {
    let plan = routed("replay");
    let mut record = claim(&enqueued(&plan), &plan, worker(true, &[], "billing"), CLAIMED_MS).unwrap();
    let complete = WorkerRequest::CompleteStep {
        ordinal: 1,
        evidence: evidence(1),
        target_receipt: target_receipt(1),
        lease_ms: LEASE_MS,
    };
    let (writes, _) = decide(
        &record,
        Request::Worker(&complete, &token_b(), None),
        at(CLAIMED_MS + 10),
    )
    .unwrap();
    record = applied(&record, &writes);
    let c = &record.command;
    assert_eq!((c.executor.as_str(), c.target.as_str()), (HTTP, HOOK));
    // The lease expires; a replay takeover starts over at step 1, which only a
    // worker with the CRM may run, whatever the command carried.
    let later = expired_after(CLAIMED_MS + 10);
    assert!(matches!(
        claim(&record, &plan, worker(false, &[HOOK], "billing"), later),
        Err(Refusal::CannotRun { .. })
    ));
    let taken = claim(&record, &plan, worker(true, &[], "billing"), later).unwrap();
    assert_eq!(
        (taken.command.executor.as_str(), taken.command.target.as_str()),
        (CRM, "crm-eu")
    );
}

#[test]
fn a_claim_without_capabilities_takes_anything_and_legacy_rows_pass_the_filter() {
    let plan = routed("resume");
    let mut record = enqueued(&plan);
    let request = ClaimRequest {
        owner: OWNER_A.into(),
        batch: 1,
        lease_ms: LEASE_MS,
        begin: false,
        capabilities: None,
    };
    assert!(decide(&record, Request::Claim(&request, &token_a(), &plan), at(CLAIMED_MS)).is_ok());
    // A command written before routing carries no route: every filter admits it,
    // and the engine decides from the plan.
    record.command.queue.clear();
    record.command.executor.clear();
    record.command.target.clear();
    assert!(worker(false, &[], DEFAULT_QUEUE).admits(&record.command));
    assert!(matches!(
        claim(&record, &plan, worker(false, &[HOOK], "billing"), CLAIMED_MS),
        Err(Refusal::CannotRun { .. })
    ));
}

#[test]
fn plan_validation_names_the_routing_field_at_fault() {
    let mut http_with_target = spec("resume", None);
    http_with_target["steps"][1]["target"] = json!("mine");
    assert!(build(http_with_target)
        .unwrap_err()
        .starts_with("steps[1].target: an http:v1 step's target is its url's scheme, host and port"));
    let mut no_url = spec("resume", None);
    no_url["steps"][1]["payload"] = json!({});
    assert_eq!(build(no_url).unwrap_err(), "steps[1].payload.url: is missing");
    assert_eq!(
        build(spec("resume", Some(" "))).unwrap_err(),
        "queue: must not be empty"
    );
    let mut blank_target = spec("resume", None);
    blank_target["steps"][0]["target"] = json!("");
    assert_eq!(build(blank_target).unwrap_err(), "steps[0].target: must not be empty");
}

#[test]
fn a_queue_and_a_target_count_in_the_fingerprint_only_when_set() {
    let without = build(spec("resume", None)).unwrap();
    assert_ne!(without.fingerprint, routed("resume").fingerprint);
    // A plan without either hashes its content as before routing existed.
    let plan = resume_plan();
    let steps: Vec<Value> = plan
        .steps
        .iter()
        .map(|s| json!({"code": s.code, "executor": s.executor, "payload": s.payload}))
        .collect();
    let content = json!({"name": plan.name, "recovery": "resume", "steps": steps, "volatile_fields": []});
    assert_eq!(plan.fingerprint, leasehold_engine::canonical::fingerprint(&content));
}
