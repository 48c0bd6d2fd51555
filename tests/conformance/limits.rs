//! Per-target limits on every ledger: live leases on a target never pass its
//! `max_in_flight`, entries never pass its rate in any window, its breaker opens
//! after consecutive give-backs and lets one probe through, a lease moved onto a
//! full target is handed back without spending a delivery, and a blocked target's
//! backlog hides no other work.

use super::{record, Harness, LEASE_MS};
use leasehold::engine::limits::{Breaker, BreakerState, Rate, TargetLimit};
use leasehold::engine::route::{Reach, DEFAULT_QUEUE};
use leasehold::engine::transition::Continued;
use leasehold::engine::{
    Action, AttemptId, Capabilities, ClaimRequest, CommandStatus, PlanId, PlanSpec, ReceiptStatus, Refusal,
    WorkerRequest,
};
use leasehold::ledger::{Claimed, Ledger, LedgerError};
use serde_json::{json, Value};
use std::collections::BTreeMap;

const CRM: &str = "acme-crm:v1";
const DRY: &str = "dry-run:v1";
const TARGET: &str = "crm-eu";

fn crm_step(code: &str) -> Value {
    json!({"code": code, "executor": CRM, "target": TARGET})
}

fn dry_step(code: &str) -> Value {
    json!({"code": code, "executor": DRY})
}

async fn enqueue_steps<L: Ledger>(l: &L, name: &str, steps: Vec<Value>) -> AttemptId {
    let spec = json!({"name": name, "recovery": "resume", "steps": steps});
    let spec: PlanSpec = serde_json::from_value(spec).expect("a well-formed spec");
    let plan: PlanId = l.register_plan(spec, &[DRY, CRM]).await.expect("register").id;
    l.enqueue(&plan, Action::Execute).await.expect("enqueue").attempt.id
}

async fn enqueue_crm<L: Ledger>(l: &L, n: usize) -> Vec<AttemptId> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(enqueue_steps(l, &format!("crm-{i}"), vec![crm_step("upsert")]).await);
    }
    ids
}

fn claim_request(owner: &str, batch: u32) -> ClaimRequest {
    let executors: BTreeMap<String, Reach> = [(DRY.to_owned(), Reach::Any), (CRM.to_owned(), Reach::Any)].into();
    ClaimRequest {
        owner: owner.into(),
        batch,
        lease_ms: LEASE_MS,
        begin: true,
        capabilities: Some(Capabilities {
            executors,
            queues: [DEFAULT_QUEUE.to_owned()].into(),
        }),
    }
}

async fn claim<L: Ledger>(l: &L, owner: &str, batch: u32) -> Vec<Claimed> {
    l.claim_batch(claim_request(owner, batch)).await.expect("claim")
}

fn limit(max_in_flight: Option<u32>, rate: Option<Rate>, breaker: Option<Breaker>) -> TargetLimit {
    TargetLimit {
        target: TARGET.into(),
        max_in_flight,
        rate,
        breaker,
    }
}

async fn finish_step<L: Ledger>(l: &L, c: &Claimed, ordinal: u32) -> Continued {
    l.complete_and_continue(&c.lease, ordinal, &json!({"ok": ordinal}), &json!({}), LEASE_MS)
        .await
        .expect("complete")
}

fn on_target(claimed: &[Claimed]) -> usize {
    claimed.iter().filter(|c| c.record.command.target == TARGET).count()
}

pub async fn a_bad_limit_is_refused_naming_the_field_and_a_new_target_is_created_on_first_use<L: Ledger>(
    h: Harness<L>,
) {
    let l = &h.ledger;
    let err = l.set_limit(limit(Some(0), None, None)).await.unwrap_err();
    assert!(
        matches!(&err, LedgerError::BadInput(m) if m.starts_with("max_in_flight: must be at least 1")),
        "{err}"
    );
    assert!(l.limits().await.expect("limits").0.is_empty(), "nothing was written");
    l.set_limit(limit(
        Some(3),
        Some(Rate {
            count: 5,
            per_ms: 1_000,
        }),
        None,
    ))
    .await
    .expect("set");
    let (rows, _) = l.limits().await.expect("limits");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].limit.max_in_flight, Some(3));
    assert_eq!(
        rows[0].limit.rate,
        Some(Rate {
            count: 5,
            per_ms: 1_000
        })
    );
    assert_eq!((rows[0].in_flight, rows[0].breaker_state), (0, BreakerState::Closed));
    l.set_limit(limit(Some(1), None, None)).await.expect("replace");
    assert_eq!(l.limits().await.expect("limits").0[0].limit.rate, None);
    assert!(l.clear_limit(TARGET).await.expect("clear"));
    assert!(!l.clear_limit(TARGET).await.expect("clear again"));
}

pub async fn live_leases_on_a_target_never_pass_its_limit_and_an_ended_lease_frees_a_slot<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    l.set_limit(limit(Some(2), None, None)).await.expect("set");
    enqueue_crm(l, 5).await;
    h.advance_ms(1);
    enqueue_steps(l, "dry", vec![dry_step("one")]).await;
    let first = claim(l, "w1", 10).await;
    assert_eq!(
        (on_target(&first), first.len()),
        (2, 3),
        "two on the target, and the other work"
    );
    assert!(claim(l, "w2", 10).await.is_empty(), "the target is full");
    assert_eq!(l.limits().await.expect("limits").0[0].in_flight, 2);
    let crm: Vec<&Claimed> = first.iter().filter(|c| c.record.command.target == TARGET).collect();
    assert_eq!(finish_step(l, crm[0], 1).await, Continued::Finished);
    let next = claim(l, "w2", 10).await;
    assert_eq!(on_target(&next), 1, "the finished lease's slot, and only it");
    h.advance_ms(LEASE_MS + 1);
    let after = claim(l, "w3", 10).await;
    assert_eq!(on_target(&after), 2, "expired leases hold no slot");
}

pub async fn a_full_targets_backlog_hides_no_other_work<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    l.set_limit(limit(Some(1), None, None)).await.expect("set");
    enqueue_crm(l, 100).await;
    h.advance_ms(1);
    let dry = enqueue_steps(l, "dry", vec![dry_step("one")]).await;
    assert_eq!(on_target(&claim(l, "w1", 1).await), 1);
    let next = claim(l, "w2", 1).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].lease.attempt_id, dry, "found behind the full target's backlog");
}

pub async fn entries_never_pass_the_rate_in_any_window<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    l.set_limit(limit(
        None,
        Some(Rate {
            count: 2,
            per_ms: 1_000,
        }),
        None,
    ))
    .await
    .expect("set");
    enqueue_crm(l, 6).await;
    assert_eq!(on_target(&claim(l, "w1", 10).await), 2);
    h.advance_ms(999);
    assert!(claim(l, "w1", 10).await.is_empty(), "still within the window");
    h.advance_ms(1);
    assert_eq!(on_target(&claim(l, "w1", 10).await), 2, "the first two left the window");
    assert_eq!(l.limits().await.expect("limits").0[0].recent, 2);
}

pub async fn a_lease_moved_onto_a_full_target_is_handed_back_without_spending_a_delivery<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    l.set_limit(limit(Some(1), None, None)).await.expect("set");
    let holder = enqueue_crm(l, 1).await.remove(0);
    h.advance_ms(1);
    let two = enqueue_steps(l, "two", vec![dry_step("prepare"), crm_step("upsert")]).await;
    let claimed = claim(l, "w1", 10).await;
    assert_eq!(claimed.len(), 2);
    let (held, moving): (Vec<&Claimed>, Vec<&Claimed>) = claimed.iter().partition(|c| c.lease.attempt_id == holder);
    let Continued::Yielded(until) = finish_step(l, moving[0], 1).await else {
        panic!("the next step's target is full: the lease is handed back");
    };
    let r = record(l, &two).await;
    assert_eq!(r.command.status, CommandStatus::Pending);
    assert_eq!((r.command.delivery_count, r.command.available_at), (0, until));
    assert_eq!(
        r.receipts.iter().map(|r| r.status).collect::<Vec<_>>(),
        [ReceiptStatus::Succeeded, ReceiptStatus::Pending]
    );
    assert!(r.command.last_error.as_deref().unwrap_or("").contains(TARGET), "{r:?}");
    assert_eq!(finish_step(l, held[0], 1).await, Continued::Finished);
    h.advance_ms(until.millis_since(h.now()));
    let again = claim(l, "w2", 10).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].lease.attempt_id, two);
    assert_eq!(again[0].record.command.delivery_count, 1);
}

pub async fn the_breaker_opens_after_consecutive_give_backs_lets_one_probe_and_closes_on_success<L: Ledger>(
    h: Harness<L>,
) {
    let l = &h.ledger;
    let breaker = Breaker {
        failures: 2,
        cooldown_ms: 1_000,
    };
    l.set_limit(limit(None, None, Some(breaker))).await.expect("set");
    enqueue_crm(l, 3).await;
    for _ in 0..2 {
        let c = claim(l, "w1", 1).await.remove(0);
        let give_back = WorkerRequest::GiveBack {
            error: "HTTP 503".into(),
            delay_ms: 0,
        };
        l.worker(&c.lease, give_back).await.expect("give back");
    }
    let rows = l.limits().await.expect("limits").0;
    assert_eq!((rows[0].breaker_state, rows[0].failures), (BreakerState::Open, 2));
    assert!(claim(l, "w1", 10).await.is_empty(), "open: nothing enters the target");
    h.advance_ms(1_000);
    let probe = claim(l, "w1", 10).await;
    assert_eq!(probe.len(), 1, "half-open: one probe");
    assert!(claim(l, "w2", 10).await.is_empty(), "the probe is out");
    assert_eq!(finish_step(l, &probe[0], 1).await, Continued::Finished);
    assert_eq!(
        l.limits().await.expect("limits").0[0].breaker_state,
        BreakerState::Closed
    );
    assert_eq!(claim(l, "w2", 10).await.len(), 2, "closed: the rest enter");
}

/// Claims by `owner` on `handle` until one answers nothing, each claim's leases
/// finished at once (so slots free up while the others claim); answers how many it
/// claimed.
async fn claim_and_finish<L: Ledger>(handle: L, owner: String) -> usize {
    let mut claimed = 0;
    for _ in 0..200 {
        let batch = claim(&handle, &owner, 5).await;
        if batch.is_empty() {
            break;
        }
        claimed += batch.len();
        for c in &batch {
            finish_step(&handle, c, 1).await;
        }
    }
    claimed
}

pub async fn race_concurrent_claimers_never_hold_more_leases_on_a_target_than_its_limit<L: Ledger>(h: Harness<L>) {
    const CLAIMERS: usize = 6;
    let l = &h.ledger;
    l.set_limit(limit(Some(2), None, None)).await.expect("set");
    let ids = enqueue_crm(l, 40).await;
    // Concurrent claimers that never finish: together they hold exactly the limit.
    let mut tasks = Vec::new();
    for w in 0..CLAIMERS {
        let handle = h.open_handle().await;
        tasks.push(tokio::spawn(async move {
            claim(&handle, &format!("holder-{w}"), 5).await.len()
        }));
    }
    let mut held = 0;
    for t in tasks {
        held += t.await.expect("claimer");
    }
    assert_eq!(held, 2, "six claimers at once hold exactly the limit");
    // Claimers that finish what they claim: every attempt is delivered, and the
    // target never had more live leases than its limit (each claim is admitted
    // under the target's lock, so the count each admission reads is exact).
    h.advance_ms(LEASE_MS + 1);
    let mut tasks = Vec::new();
    for w in 0..CLAIMERS {
        let handle = h.open_handle().await;
        tasks.push(tokio::spawn(claim_and_finish(handle, format!("finisher-{w}"))));
    }
    let mut delivered = 0;
    for t in tasks {
        delivered += t.await.expect("claimer");
    }
    assert!(delivered >= ids.len(), "{delivered} claims for {} attempts", ids.len());
    for id in &ids {
        assert_eq!(record(l, id).await.command.status, CommandStatus::Delivered);
    }
}

pub async fn an_expired_lease_is_not_renewed_onto_a_full_target<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    l.set_limit(limit(Some(1), None, None)).await.expect("set");
    enqueue_crm(l, 1).await;
    let first = claim(l, "w1", 10).await.remove(0);
    h.advance_ms(LEASE_MS + 1);
    // Its lease expired (nobody took it over): the target's one slot is free, and a
    // claim of other work on the target (another queue) takes it.
    let spec = json!({"name": "other", "recovery": "resume", "queue": "other", "steps": [crm_step("upsert")]});
    let spec: PlanSpec = serde_json::from_value(spec).expect("a well-formed spec");
    let plan = l.register_plan(spec, &[DRY, CRM]).await.expect("register").id;
    l.enqueue(&plan, Action::Execute).await.expect("enqueue");
    let mut other_queue = claim_request("w2", 10);
    if let Some(caps) = other_queue.capabilities.as_mut() {
        caps.queues = ["other".to_owned()].into();
    }
    assert_eq!(l.claim_batch(other_queue).await.expect("claim").len(), 1);
    // Renewing the first lease would put two leases on the target.
    let err = l.heartbeat(&first.lease, LEASE_MS).await.unwrap_err();
    assert!(matches!(&err, LedgerError::Refused(Refusal::Limited { .. })), "{err}");
    let r = record(l, &first.lease.attempt_id).await;
    assert!(
        r.command.lease_until.is_some_and(|u| u < h.now()),
        "nothing was written"
    );
}
