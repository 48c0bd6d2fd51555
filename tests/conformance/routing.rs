//! Routing on every ledger: a claim takes only commands whose next step the
//! claiming worker can run (its executors, the targets they reach, its queues),
//! filtered in the claim itself; the command's route follows its next step; the
//! fleet's rows say what a waiting attempt waits for.

use super::{record, Harness, LEASE_MS};
use leasehold::engine::route::{Reach, DEFAULT_QUEUE};
use leasehold::engine::{Action, AttemptId, Capabilities, ClaimRequest, PlanId, PlanSpec, WorkerRequest};
use leasehold::ledger::fleet::{self, LIVE_FOR_MS};
use leasehold::ledger::{Claimed, Ledger};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

const CRM: &str = "acme-crm:v1";
const HTTP: &str = "http:v1";
const DRY: &str = "dry-run:v1";
const HOOK: &str = "http://127.0.0.1:9";
const ROUTED_KNOWN: &[&str] = &[DRY, CRM, HTTP];

fn crm_step(code: &str) -> Value {
    json!({"code": code, "executor": CRM, "target": "crm-eu"})
}

fn dry_step(code: &str) -> Value {
    json!({"code": code, "executor": DRY})
}

fn hook_step(code: &str) -> Value {
    json!({"code": code, "executor": HTTP, "payload": {"url": format!("{HOOK}/hook")}})
}

/// Registers a resume plan of `steps` (in `queue`, if given) and enqueues it.
async fn enqueue_routed<L: Ledger>(l: &L, name: &str, steps: Vec<Value>, queue: Option<&str>) -> AttemptId {
    let mut spec = json!({"name": name, "recovery": "resume", "steps": steps});
    if let Some(q) = queue {
        spec["queue"] = json!(q);
    }
    let spec: PlanSpec = serde_json::from_value(spec).expect("a well-formed spec");
    let plan: PlanId = l.register_plan(spec, ROUTED_KNOWN).await.expect("register").id;
    l.enqueue(&plan, Action::Execute).await.expect("enqueue").attempt.id
}

/// A worker that runs `any` for every target and `http:v1` to `hosts`, taking
/// `queues`.
fn caps(any: &[&str], hosts: &[&str], queues: &[&str]) -> Capabilities {
    let mut executors: BTreeMap<String, Reach> = any.iter().map(|e| ((*e).to_owned(), Reach::Any)).collect();
    executors.insert(
        HTTP.into(),
        Reach::Only(hosts.iter().map(|h| (*h).to_owned()).collect()),
    );
    Capabilities {
        executors,
        queues: queues.iter().map(|q| (*q).to_owned()).collect::<BTreeSet<_>>(),
    }
}

async fn claim_as<L: Ledger>(l: &L, owner: &str, caps: Capabilities, batch: u32) -> Vec<Claimed> {
    let request = ClaimRequest {
        owner: owner.into(),
        batch,
        lease_ms: LEASE_MS,
        begin: true,
        capabilities: Some(caps),
    };
    l.claim_batch(request).await.expect("claim")
}

fn attempts(claimed: &[Claimed]) -> Vec<&AttemptId> {
    claimed.iter().map(|c| &c.lease.attempt_id).collect()
}

pub async fn claims_take_only_the_routes_the_worker_can_run<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let crm = enqueue_routed(l, "crm", vec![crm_step("upsert")], None).await;
    h.advance_ms(1);
    let hook = enqueue_routed(l, "hook", vec![hook_step("notify")], None).await;
    h.advance_ms(1);
    let billing = enqueue_routed(l, "billing", vec![dry_step("bill")], Some("billing")).await;
    h.advance_ms(1);
    let default_queue = [DEFAULT_QUEUE];
    let plain = claim_as(l, "plain", caps(&[DRY], &["http://other:80"], &default_queue), 10).await;
    assert!(
        plain.is_empty(),
        "a dry-run worker of the default queue runs none of them"
    );
    let crm_worker = claim_as(l, "crm", caps(&[DRY, CRM], &[], &default_queue), 10).await;
    assert_eq!(attempts(&crm_worker), [&crm]);
    let hook_worker = claim_as(l, "hook", caps(&[DRY], &[HOOK], &default_queue), 10).await;
    assert_eq!(attempts(&hook_worker), [&hook]);
    let billing_worker = claim_as(l, "billing", caps(&[DRY], &[], &["billing"]), 10).await;
    assert_eq!(attempts(&billing_worker), [&billing]);
    let r = record(l, &crm).await;
    assert_eq!(
        (r.command.executor.as_str(), r.command.target.as_str()),
        (CRM, "crm-eu")
    );
    let r = record(l, &hook).await;
    assert_eq!(r.receipts[0].target, HOOK);
}

pub async fn a_claim_finds_a_runnable_command_behind_many_it_cannot_run<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    // More than a one-command claim's window on any ledger (PostgreSQL's is 64): the
    // filter is in the claim's query, not applied to a window of the oldest commands
    // afterwards.
    for i in 0..100 {
        enqueue_routed(l, &format!("crm-{i}"), vec![crm_step("upsert")], None).await;
    }
    h.advance_ms(1);
    let dry = enqueue_routed(l, "dry", vec![dry_step("one")], None).await;
    let claimed = claim_as(l, "plain", caps(&[DRY], &[], &[DEFAULT_QUEUE]), 1).await;
    assert_eq!(attempts(&claimed), [&dry]);
}

pub async fn the_command_follows_its_next_step_and_only_a_capable_worker_takes_it_over<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = enqueue_routed(l, "two-step", vec![dry_step("prepare"), crm_step("upsert")], None).await;
    let both = caps(&[DRY, CRM], &[], &[DEFAULT_QUEUE]);
    let c = claim_as(l, "w1", both.clone(), 1).await.remove(0);
    let complete = WorkerRequest::CompleteStep {
        ordinal: 1,
        evidence: json!({"ok": 1}),
        target_receipt: json!({"ref": 1}),
        lease_ms: LEASE_MS,
    };
    l.worker(&c.lease, complete).await.expect("complete step 1");
    let r = record(l, &id).await;
    assert_eq!(
        (r.command.executor.as_str(), r.command.target.as_str()),
        (CRM, "crm-eu")
    );
    h.advance_ms(LEASE_MS + 1);
    let dry_only = claim_as(l, "w2", caps(&[DRY], &[], &[DEFAULT_QUEUE]), 1).await;
    assert!(dry_only.is_empty(), "its next step needs the CRM");
    let taken = claim_as(l, "w3", both, 1).await;
    assert_eq!(attempts(&taken), [&id]);
}

pub async fn the_fleet_says_what_a_queued_attempt_waits_for<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = enqueue_routed(l, "crm-wait", vec![crm_step("upsert")], None).await;
    let plan = l.plan(&record(l, &id).await.attempt.plan_id).await.expect("plan");
    let cli = caps(&[DRY], &[], &[DEFAULT_QUEUE]);
    l.report_worker("cli-1", &cli, true).await.expect("report");
    let (rows, now) = l.workers().await.expect("workers");
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].id.as_str(), &rows[0].capabilities), ("cli-1", &cli));
    assert_eq!((rows[0].started_at, rows[0].last_seen_at), (now, now));
    let r = record(l, &id).await;
    assert_eq!(
        fleet::waits_for(&r, &plan, &rows, now).as_deref(),
        Some("a worker that can run acme-crm:v1")
    );
    h.advance_ms(LIVE_FOR_MS / 2);
    let crm = caps(&[DRY, CRM], &[], &[DEFAULT_QUEUE]);
    l.report_worker("cli-1", &crm, false).await.expect("renew");
    let (rows, now) = l.workers().await.expect("workers");
    assert_eq!(rows[0].started_at.plus_ms(LIVE_FOR_MS / 2), rows[0].last_seen_at);
    assert_eq!(
        fleet::waits_for(&r, &plan, &rows, now),
        None,
        "a live worker can run it"
    );
    h.advance_ms(LIVE_FOR_MS + 1);
    let (rows, now) = l.workers().await.expect("workers");
    assert_eq!(
        fleet::waits_for(&r, &plan, &rows, now).as_deref(),
        Some("a worker (none is live)")
    );
}
