//! Templates and ordered keys on every ledger: each attempt's input is checked,
//! resolved and frozen on its receipts; bad input is refused naming the field with
//! nothing written; attempts with one order key run one at a time in enqueue order,
//! and what follows a failed one is the plan's rule.

use super::{assert_nothing_claimable, claim_one, deliver, fail_at, record, Harness, KNOWN, LEASE_MS};
use leasehold::engine::{AttemptRecord, AttemptStatus, CommandStatus, PlanId, PlanSpec, Refusal};
use leasehold::ledger::{EnqueueRequest, Ledger, LedgerError};
use serde_json::{json, Value};

/// A template granting a role: `user` required, `role` optional, at most 64 bytes.
fn template_spec(name: &str, on_failure: Option<&str>) -> PlanSpec {
    let mut spec = json!({
        "name": name,
        "recovery": "resume",
        "input": {
            "user": {"type": "string", "required": true},
            "role": {"type": "string", "max_bytes": 64},
        },
        "steps": [
            {"code": "grant", "executor": "dry-run:v1", "payload": {"user": {"$input": "/user"}, "role": {"$input": "/role"}}},
            {"code": "audit", "executor": "dry-run:v1", "payload": {"kind": "grant"}},
        ],
    });
    if let Some(rule) = on_failure {
        spec["on_failure"] = json!(rule);
    }
    serde_json::from_value(spec).expect("a template spec")
}

async fn register_template<L: Ledger>(l: &L, name: &str, on_failure: Option<&str>) -> PlanId {
    l.register_plan(template_spec(name, on_failure), KNOWN)
        .await
        .expect("register template")
        .id
}

fn request(input: Value, order_key: Option<&str>) -> EnqueueRequest {
    EnqueueRequest::new(leasehold::engine::Action::Execute)
        .with_input(Some(input))
        .ordered(order_key.map(str::to_owned))
}

async fn enqueue<L: Ledger>(l: &L, plan: &PlanId, input: Value, order_key: Option<&str>) -> AttemptRecord {
    let enqueued = l.enqueue_with(plan, request(input, order_key)).await.expect("enqueue");
    assert!(enqueued.created);
    enqueued.record
}

async fn status<L: Ledger>(l: &L, r: &AttemptRecord) -> (AttemptStatus, CommandStatus) {
    let now = record(l, &r.attempt.id).await;
    (now.attempt.status, now.command.status)
}

pub async fn a_template_freezes_each_inputs_payloads_on_its_receipts_and_runs_them_side_by_side<L: Ledger>(
    h: Harness<L>,
) {
    let l = &h.ledger;
    let id = register_template(l, "grants", None).await;
    let plan = l.plan(&id).await.expect("plan");
    assert!(plan.is_template() && plan.input == template_spec("grants", None).input);
    let ada = enqueue(l, &id, json!({"user": "ada", "role": "admin"}), None).await;
    let bob = enqueue(l, &id, json!({"user": "bob"}), None).await;
    let read = record(l, &ada.attempt.id).await;
    assert_eq!(read, ada, "what the enqueue answered is what was stored");
    assert_eq!(read.attempt.input.as_deref(), Some(r#"{"role":"admin","user":"ada"}"#));
    assert_eq!(
        read.receipts[0].payload.as_deref(),
        Some(r#"{"role":"admin","user":"ada"}"#)
    );
    assert_eq!(read.receipts[1].payload.as_deref(), Some(r#"{"kind":"grant"}"#));
    let bob_read = record(l, &bob.attempt.id).await;
    assert_eq!(
        bob_read.receipts[0].payload.as_deref(),
        Some(r#"{"role":null,"user":"bob"}"#)
    );
    assert_ne!(read.attempt.input_sha256, bob_read.attempt.input_sha256);
    let claimed = l.claim("w", 10, LEASE_MS).await.expect("claim");
    assert_eq!(
        claimed.len(),
        2,
        "a template's attempts without an order key run side by side"
    );
    for c in &claimed {
        let step = AttemptRecord::step_of(&c.plan, &c.record.receipts[0]).expect("the step");
        let want = if c.record.attempt.id == ada.attempt.id {
            "ada"
        } else {
            "bob"
        };
        assert_eq!(step.payload["user"], json!(want), "the worker runs the frozen payload");
    }
}

pub async fn bad_input_is_refused_naming_the_field_and_writes_nothing<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = register_template(l, "strict", None).await;
    let cases = [
        (json!({"role": "admin"}), "input.user: is required"),
        (json!({"user": 7}), "input.user: expected string, found integer"),
        (json!({"user": "ada", "role": "r".repeat(100)}), "input.role:"),
        (json!({"user": "ada", "team": "x"}), "input.team: is not a field"),
        (json!("ada"), "input: must be a JSON object"),
        (json!({"user": "u".repeat(70_000)}), "input: "),
    ];
    for (input, says) in cases {
        let e = l
            .enqueue_with(&id, request(input.clone(), None))
            .await
            .expect_err("bad input");
        assert!(
            matches!(&e, LedgerError::BadInput(m) if m.starts_with(says)),
            "{input}: {e}"
        );
    }
    let e = l
        .enqueue_with(&id, request(json!({"user": "ada"}), Some("")))
        .await
        .expect_err("empty order key");
    assert!(
        matches!(&e, LedgerError::BadInput(m) if m.starts_with("order_key")),
        "{e}"
    );
    let plain = super::register(l, "plain", "resume", 1).await;
    for (req, says) in [
        (request(json!({"user": "ada"}), None), "input:"),
        (
            EnqueueRequest::new(leasehold::engine::Action::Execute).ordered(Some("k".into())),
            "order_key:",
        ),
    ] {
        let e = l.enqueue_with(&plain, req).await.expect_err("no input on a plain plan");
        assert!(matches!(&e, LedgerError::BadInput(m) if m.starts_with(says)), "{e}");
    }
    assert!(l.history(&id).await.unwrap().is_empty(), "nothing written");
    assert!(l.history(&plain).await.unwrap().is_empty(), "nothing written");
    assert_nothing_claimable(l).await;
}

pub async fn an_order_key_runs_one_attempt_at_a_time_in_enqueue_order<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = register_template(l, "ordered", None).await;
    let grant = enqueue(l, &id, json!({"user": "ada", "role": "admin"}), Some("ada")).await;
    let revoke = enqueue(l, &id, json!({"user": "ada", "role": "none"}), Some("ada")).await;
    let again = enqueue(l, &id, json!({"user": "ada", "role": "viewer"}), Some("ada")).await;
    let other = enqueue(l, &id, json!({"user": "bob"}), Some("bob")).await;
    assert_eq!(grant.command.status, CommandStatus::Pending);
    assert_eq!(revoke.command.status, CommandStatus::Waiting);
    assert_eq!(
        other.command.status,
        CommandStatus::Pending,
        "another key does not wait"
    );
    assert_eq!(l.open_attempts().await.unwrap(), 4, "a waiting attempt is open");
    let claimed = l.claim("w", 10, LEASE_MS).await.expect("claim");
    let ids: Vec<_> = claimed.iter().map(|c| c.record.attempt.id.clone()).collect();
    assert_eq!(ids.len(), 2, "one attempt per key: {ids:?}");
    assert!(ids.contains(&grant.attempt.id) && ids.contains(&other.attempt.id));
    for c in &claimed {
        super::finish_all(l, c, "w").await;
    }
    assert_eq!(
        status(l, &revoke).await,
        (AttemptStatus::Queued, CommandStatus::Pending)
    );
    assert_eq!(status(l, &again).await, (AttemptStatus::Queued, CommandStatus::Waiting));
    let next = deliver(l, "w").await;
    assert_eq!(next.record.attempt.id, revoke.attempt.id, "the next in enqueue order");
    let last = deliver(l, "w").await;
    assert_eq!(last.record.attempt.id, again.attempt.id);
    assert_nothing_claimable(l).await;
    assert_eq!(l.open_attempts().await.unwrap(), 0);
}

pub async fn a_failed_head_blocks_its_key_or_lets_the_next_run_as_the_plan_says<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let block = register_template(l, "blocking", None).await;
    let head = enqueue(l, &block, json!({"user": "ada"}), Some("k")).await;
    let behind = [
        enqueue(l, &block, json!({"user": "ada", "role": "a"}), Some("k")).await,
        enqueue(l, &block, json!({"user": "ada", "role": "b"}), Some("k")).await,
    ];
    let failed = fail_at(l, "w", 1).await;
    assert_eq!(failed.record.attempt.id, head.attempt.id);
    for r in &behind {
        let now = record(l, &r.attempt.id).await;
        assert_eq!(
            (now.attempt.status, now.command.status),
            (AttemptStatus::Aborted, CommandStatus::Aborted)
        );
        let error = now.attempt.error.unwrap_or_default();
        assert!(
            error.contains("blocked") && error.contains(head.attempt.id.as_str()),
            "{error}"
        );
    }
    assert_nothing_claimable(l).await;
    let fresh = enqueue(l, &block, json!({"user": "ada"}), Some("k")).await;
    assert_eq!(
        fresh.command.status,
        CommandStatus::Pending,
        "an ended key takes new attempts"
    );
    assert_eq!(deliver(l, "w").await.record.attempt.id, fresh.attempt.id);
    let go_on = register_template(l, "continuing", Some("continue")).await;
    enqueue(l, &go_on, json!({"user": "ada"}), Some("k")).await;
    let next = enqueue(l, &go_on, json!({"user": "ada", "role": "a"}), Some("k")).await;
    fail_at(l, "w", 1).await;
    assert_eq!(status(l, &next).await, (AttemptStatus::Queued, CommandStatus::Pending));
}

pub async fn aborting_a_waiting_attempt_skips_it_and_the_order_goes_on<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = register_template(l, "skip", None).await;
    let head = enqueue(l, &id, json!({"user": "ada"}), Some("k")).await;
    let skipped = enqueue(l, &id, json!({"user": "ada", "role": "a"}), Some("k")).await;
    let last = enqueue(l, &id, json!({"user": "ada", "role": "b"}), Some("k")).await;
    let aborted = l.abort(&skipped.attempt.id, "not needed").await.expect("abort");
    assert_eq!(aborted.command.status, CommandStatus::Aborted);
    assert_eq!(status(l, &head).await, (AttemptStatus::Queued, CommandStatus::Pending));
    assert_eq!(status(l, &last).await, (AttemptStatus::Queued, CommandStatus::Waiting));
    let c = claim_one(l, "w").await;
    assert_eq!(c.record.attempt.id, head.attempt.id);
    super::finish_all(l, &c, "w").await;
    assert_eq!(deliver(l, "w").await.record.attempt.id, last.attempt.id);
}

pub async fn an_enqueue_key_covers_the_input_and_the_order_key<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let id = register_template(l, "keyed-template", None).await;
    let keyed = |input: Value, order: Option<&str>| request(input, order).keyed(Some("change-1".into()));
    let first = l
        .enqueue_with(&id, keyed(json!({"user": "ada"}), Some("ada")))
        .await
        .expect("first");
    let again = l
        .enqueue_with(&id, keyed(json!({"user": "ada"}), Some("ada")))
        .await
        .expect("again");
    assert_eq!(
        (again.created, &again.record.attempt.id),
        (false, &first.record.attempt.id)
    );
    for other in [
        keyed(json!({"user": "bob"}), Some("ada")),
        keyed(json!({"user": "ada"}), Some("bob")),
    ] {
        let e = l.enqueue_with(&id, other).await.expect_err("another request");
        assert!(matches!(e, LedgerError::Refused(Refusal::KeyReused { .. })), "{e}");
    }
    assert_eq!(l.history(&id).await.unwrap().len(), 1);
}

pub async fn retention_keeps_a_templates_baseline_of_the_latest_input<L: Ledger>(h: Harness<L>) {
    use leasehold::engine::gate::gate;
    use leasehold::engine::{AttemptStatus, Timestamp};
    use leasehold::ledger::prune::{prune, PruneOptions};
    let l = &h.ledger;
    let id = register_template(l, "retained", None).await;
    // #1 ada (the baseline of #3), #2 bob, #3 ada (the latest), each delivered.
    for user in ["ada", "bob", "ada"] {
        enqueue(l, &id, json!({"user": user}), None).await;
        deliver(l, "w").await;
        h.advance_ms(1);
    }
    let plan = l.plan(&id).await.expect("plan");
    let before = gate(&plan, &l.history(&id).await.expect("history"));
    h.advance_ms(10 * 86_400_000);
    let options = PruneOptions {
        cutoff: Timestamp::from_millis(h.now().as_millis() - 1),
        states: vec![AttemptStatus::Succeeded],
        batch: 10,
        dry_run: false,
        rest_percent: 0,
    };
    assert_eq!(prune(l, &options, None).await.expect("prune"), 1, "bob's attempt only");
    let kept: Vec<u32> = l.history(&id).await.unwrap().iter().map(|r| r.attempt.number).collect();
    assert_eq!(kept, [1, 3], "the latest and the baseline of its input");
    assert_eq!(
        gate(&plan, &l.history(&id).await.expect("history")),
        before,
        "the gate is unchanged"
    );
}
