//! Enqueue: the plan guard, the action guards, and the rows an accepted enqueue writes.

mod common;

use common::*;
use leasehold_engine::transition::{self, enqueue};
use leasehold_engine::{
    Action, Attempt, AttemptRecord, AttemptStatus, Command, CommandStatus, PlanStatus, Receipt, ReceiptStatus, Refusal,
};

fn pending_receipt(attempt: u32, ordinal: u32, code: &str) -> Receipt {
    Receipt {
        payload: None,
        attempt_id: attempt_id(attempt),
        ordinal,
        step_code: code.to_owned(),
        idempotency_key: key(attempt, ordinal, code),
        // A step of another executor than http:v1 targets its executor by default.
        executor: EXECUTOR.to_owned(),
        target: EXECUTOR.to_owned(),
        status: ReceiptStatus::Pending,
        evidence: None,
        evidence_sha256: None,
        target_receipt: None,
        error: None,
        started_at: None,
        finished_at: None,
    }
}

fn guard_reason(refusal: Refusal, expected_action: Action) -> String {
    match refusal {
        Refusal::Guard { action, reason } => {
            assert_eq!(action, expected_action);
            reason
        }
        other => panic!("expected an action guard refusal, got {other:?}"),
    }
}

#[test]
fn execute_writes_a_queued_attempt_pending_receipts_in_step_order_and_a_pending_command() {
    let plan = resume_plan();
    let record = allowed(enqueue(&plan, &[], Action::Execute, ids(1), at(ENQUEUED_MS)));
    let expected = AttemptRecord {
        attempt: Attempt {
            input: None,
            input_sha256: None,
            order_key: None,
            id: attempt_id(1),
            plan_id: plan.id.clone(),
            number: 1,
            action: Action::Execute,
            status: AttemptStatus::Queued,
            created_at: at(ENQUEUED_MS),
            started_at: None,
            finished_at: None,
            error: None,
            trace: None,
            enqueue_key: None,
            request_sha256: None,
        },
        command: Command {
            id: command_id(1),
            attempt_id: attempt_id(1),
            status: CommandStatus::Pending,
            available_at: at(ENQUEUED_MS),
            lease_owner: None,
            lease_token: None,
            lease_until: None,
            last_heartbeat_at: None,
            delivery_count: 0,
            last_error: None,
            finished_at: None,
            // The plan names no queue; the command carries the first step's route.
            queue: "default".to_owned(),
            executor: EXECUTOR.to_owned(),
            target: EXECUTOR.to_owned(),
        },
        receipts: vec![
            pending_receipt(1, 1, "create-schema"),
            pending_receipt(1, 2, "load"),
            pending_receipt(1, 3, "migrate"),
            pending_receipt(1, 4, "notify"),
        ],
    };
    assert_eq!(record, expected);
}

#[test]
fn every_step_of_an_attempt_gets_its_own_idempotency_key() {
    let record = enqueued(&resume_plan());
    let mut keys: Vec<&str> = record.receipts.iter().map(|r| r.idempotency_key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), record.receipts.len());
}

#[test]
fn execute_after_terminal_attempts_is_accepted_and_numbered_after_the_latest() {
    let plan = resume_plan();
    let history = [delivered(&plan)];
    let record = allowed(enqueue(&plan, &history, Action::Execute, ids(2), at(90_000)));
    assert_eq!(record.attempt.number, 2);
    assert_eq!(record.attempt.action, Action::Execute);
    assert_eq!(record.receipts.len(), 4);
}

#[test]
fn execute_with_an_open_attempt_is_refused() {
    let plan = resume_plan();
    for open in [enqueued(&plan), claimed(&plan), in_progress(&plan, 2, true)] {
        let status = open.attempt.status;
        let reason = guard_reason(
            refused(enqueue(&plan, &[open], Action::Execute, ids(2), at(90_000))),
            Action::Execute,
        );
        assert_eq!(reason, format!("attempt att-1 is still {status}"));
    }
}

#[test]
fn retry_and_compensate_with_an_open_attempt_are_refused_too() {
    let plan = resume_plan();
    let history = [failed_at(&plan, 3), {
        let mut open = enqueued(&plan);
        open.attempt.id = attempt_id(2);
        open.attempt.number = 2;
        open
    }];
    for action in [Action::Retry, Action::Compensate] {
        let refusal = refused(enqueue(&plan, &history, action, ids(3), at(90_000)));
        assert_eq!(
            refusal.to_string(),
            format!("{action} refused: attempt att-2 is still QUEUED")
        );
    }
}

#[test]
fn retry_after_a_failed_attempt_enqueues_every_step_again() {
    let plan = resume_plan();
    let history = [failed_at(&plan, 3)];
    let record = allowed(enqueue(&plan, &history, Action::Retry, ids(2), at(90_000)));
    assert_eq!(record.attempt.number, 2);
    assert_eq!(record.attempt.action, Action::Retry);
    assert_eq!(record.attempt.status, AttemptStatus::Queued);
    assert_eq!(
        record.receipts,
        vec![
            pending_receipt(2, 1, "create-schema"),
            pending_receipt(2, 2, "load"),
            pending_receipt(2, 3, "migrate"),
            pending_receipt(2, 4, "notify"),
        ]
    );
    assert_eq!(record.command.status, CommandStatus::Pending);
    assert_eq!(record.command.available_at, at(90_000));
}

#[test]
fn retry_after_an_aborted_attempt_is_accepted() {
    let plan = resume_plan();
    let history = [aborted_while_running(&plan, 2)];
    let record = allowed(enqueue(&plan, &history, Action::Retry, ids(2), at(90_000)));
    assert_eq!((record.attempt.number, record.attempt.action), (2, Action::Retry));
}

#[test]
fn retry_with_no_attempt_is_refused() {
    let plan = resume_plan();
    let reason = guard_reason(
        refused(enqueue(&plan, &[], Action::Retry, ids(1), at(90_000))),
        Action::Retry,
    );
    assert_eq!(reason, "plan plan-1 has no attempt to retry");
}

#[test]
fn retry_after_a_succeeded_latest_attempt_is_refused() {
    let plan = resume_plan();
    // An older failure does not matter: only the latest attempt does.
    let mut older = failed_at(&plan, 3);
    older.attempt.id = attempt_id(0);
    older.attempt.number = 0;
    let history = [delivered(&plan), older];
    let reason = guard_reason(
        refused(enqueue(&plan, &history, Action::Retry, ids(2), at(90_000))),
        Action::Retry,
    );
    assert_eq!(reason, "the latest attempt att-1 is SUCCEEDED, not FAILED or ABORTED");
}

#[test]
fn compensate_enqueues_the_succeeded_steps_reversed() {
    let plan = resume_plan();
    let history = [failed_at(&plan, 3)];
    let record = allowed(enqueue(&plan, &history, Action::Compensate, ids(2), at(90_000)));
    assert_eq!(record.attempt.number, 2);
    assert_eq!(record.attempt.action, Action::Compensate);
    assert_eq!(record.attempt.status, AttemptStatus::Queued);
    assert_eq!(
        record.receipts,
        vec![pending_receipt(2, 1, "load"), pending_receipt(2, 2, "create-schema")]
    );
    assert_eq!(record.command.status, CommandStatus::Pending);
}

#[test]
fn compensate_of_a_delivered_attempt_undoes_every_step_in_reverse() {
    let plan = resume_plan();
    let history = [delivered(&plan)];
    let record = allowed(enqueue(&plan, &history, Action::Compensate, ids(2), at(90_000)));
    let codes: Vec<&str> = record.receipts.iter().map(|r| r.step_code.as_str()).collect();
    assert_eq!(codes, ["notify", "migrate", "load", "create-schema"]);
    let ordinals: Vec<u32> = record.receipts.iter().map(|r| r.ordinal).collect();
    assert_eq!(ordinals, [1, 2, 3, 4]);
}

#[test]
fn compensate_with_no_forward_attempt_is_refused() {
    let plan = resume_plan();
    let reason = guard_reason(
        refused(enqueue(&plan, &[], Action::Compensate, ids(1), at(90_000))),
        Action::Compensate,
    );
    assert_eq!(reason, "plan plan-1 has no forward attempt to compensate");
}

#[test]
fn compensate_with_no_succeeded_steps_is_refused() {
    let plan = resume_plan();
    let history = [failed_at(&plan, 1)];
    let reason = guard_reason(
        refused(enqueue(&plan, &history, Action::Compensate, ids(2), at(90_000))),
        Action::Compensate,
    );
    assert_eq!(reason, "attempt att-1 has no succeeded step to compensate");
}

#[test]
fn compensate_of_an_already_compensated_attempt_is_refused() {
    let plan = resume_plan();
    let forward = failed_at(&plan, 3);
    let compensation = allowed(enqueue(
        &plan,
        std::slice::from_ref(&forward),
        Action::Compensate,
        ids(2),
        at(90_000),
    ));
    let compensation = claimed_by(&compensation, &plan, OWNER_A, token_a(), 91_000);
    let compensation = run_to_delivery(&compensation, &token_a(), 92_000);
    assert_eq!(compensation.attempt.status, AttemptStatus::Succeeded);
    let history = [forward, compensation];
    let reason = guard_reason(
        refused(enqueue(&plan, &history, Action::Compensate, ids(3), at(99_000))),
        Action::Compensate,
    );
    assert_eq!(reason, "attempt att-1 is already compensated");
}

#[test]
fn compensate_after_a_failed_compensation_is_accepted() {
    let plan = resume_plan();
    let forward = failed_at(&plan, 3);
    let compensation = allowed(enqueue(
        &plan,
        std::slice::from_ref(&forward),
        Action::Compensate,
        ids(2),
        at(90_000),
    ));
    let compensation = claimed_by(&compensation, &plan, OWNER_A, token_a(), 91_000);
    let compensation = applied(
        &compensation,
        &allowed(transition::fail(
            &compensation,
            None,
            "undo failed",
            &token_a(),
            at(92_000),
        )),
    );
    let history = [forward, compensation];
    let record = allowed(enqueue(&plan, &history, Action::Compensate, ids(3), at(99_000)));
    assert_eq!(record.attempt.number, 3);
    assert_eq!(record.receipts.len(), 2);
}

#[test]
fn enqueue_on_a_retired_plan_is_refused() {
    let mut plan = resume_plan();
    plan.status = PlanStatus::Retired;
    for action in [Action::Execute, Action::Retry, Action::Compensate] {
        let reason = guard_reason(refused(enqueue(&plan, &[], action, ids(1), at(90_000))), action);
        assert_eq!(reason, "plan plan-1 is RETIRED");
    }
}

#[test]
fn enqueue_with_a_tampered_plan_fingerprint_is_refused() {
    let mut plan = resume_plan();
    plan.steps[1].payload = serde_json::json!({"n": 2, "drop": "everything"});
    let reason = guard_reason(
        refused(enqueue(&plan, &[], Action::Execute, ids(1), at(90_000))),
        Action::Execute,
    );
    assert!(reason.starts_with("plan plan-1: fingerprint: stored "), "{reason}");

    let mut plan = resume_plan();
    plan.fingerprint = "0".repeat(64);
    assert!(matches!(
        refused(enqueue(&plan, &[], Action::Execute, ids(1), at(90_000))),
        Refusal::Guard { .. }
    ));
}

#[test]
fn a_follow_up_is_asked_of_the_plans_latest_attempt_in_the_right_state() {
    let plan = resume_plan();
    let failed = failed_at(&plan, 2);
    let history = [failed.clone()];
    assert_eq!(transition::follow_up_of(&failed, &history, Action::Retry), Ok(()));
    assert_eq!(transition::follow_up_of(&failed, &history, Action::Compensate), Ok(()));
    let done = delivered(&plan);
    let refused = transition::follow_up_of(&done, std::slice::from_ref(&done), Action::Retry).unwrap_err();
    assert!(
        refused.to_string().contains("is SUCCEEDED, not FAILED or ABORTED"),
        "{refused}"
    );
    let mut newer = failed.clone();
    newer.attempt.number = 2;
    newer.attempt.id = attempt_id(2);
    let refused = transition::follow_up_of(&failed, &[failed.clone(), newer], Action::Retry).unwrap_err();
    assert!(
        refused.to_string().contains("is not the latest attempt of plan"),
        "{refused}"
    );
}

#[test]
fn an_enqueue_key_answers_the_same_request_and_refuses_another() {
    let plan = resume_plan();
    let mut first = enqueue(&plan, &[], Action::Execute, ids(1), at(90_000)).unwrap();
    let sha = transition::enqueue_request_sha256(&plan.id, Action::Execute, transition::Start::Now, Default::default());
    first.attempt.enqueue_key = Some("k".into());
    first.attempt.request_sha256 = Some(sha.clone());
    assert_eq!(transition::keyed(None, "k", &sha), Ok(None), "a new key enqueues");
    assert_eq!(
        transition::keyed(Some(&first), "k", &sha),
        Ok(Some(&first)),
        "the same request answers"
    );
    let other =
        transition::enqueue_request_sha256(&plan.id, Action::Compensate, transition::Start::Now, Default::default());
    assert_eq!(
        transition::keyed(Some(&first), "k", &other),
        Err(Refusal::KeyReused {
            key: "k".into(),
            attempt: first.attempt.id.clone()
        })
    );
}

#[test]
fn a_request_is_its_plan_action_start_input_and_order_key_as_asked_for() {
    use transition::{enqueue_request_sha256, Start, TemplateKey};
    let sha = |plan: &leasehold_engine::PlanId, action, start| {
        enqueue_request_sha256(plan, action, start, TemplateKey::default())
    };
    let plan = resume_plan();
    let now = sha(&plan.id, Action::Execute, Start::Now);
    assert_eq!(now, sha(&plan.id, Action::Execute, Start::Now));
    let templated = |input: Option<&str>, order_key: Option<&str>| {
        let key = TemplateKey {
            input_sha256: input,
            order_key,
        };
        enqueue_request_sha256(&plan.id, Action::Execute, Start::Now, key)
    };
    let variants = [
        sha(&plan.id, Action::Retry, Start::Now),
        sha(&plan.id, Action::Execute, Start::After(1_000)),
        sha(&plan.id, Action::Execute, Start::At(at(1_000))),
        sha(&leasehold_engine::PlanId::new("pln-other"), Action::Execute, Start::Now),
        templated(Some("aa"), None),
        templated(Some("aa"), Some("k")),
        templated(None, Some("k")),
    ];
    assert!(variants.iter().all(|v| *v != now), "each part counts");
    assert_ne!(variants[1], sha(&plan.id, Action::Execute, Start::After(2_000)));
    assert_ne!(variants[4], templated(Some("bb"), None), "the input counts");
    assert_ne!(variants[5], templated(Some("aa"), Some("j")), "the order key counts");
}

#[test]
fn an_enqueue_key_is_one_to_255_visible_characters() {
    use transition::check_enqueue_key as check;
    assert!(check("--key", "order-42/grant").is_ok());
    assert!(check("--key", &"k".repeat(255)).is_ok());
    for (bad, why) in [
        ("", "0 characters"),
        (&*"k".repeat(256), "256 characters"),
        ("a\u{200b}b", "--key"),
    ] {
        let e = check("--key", bad).unwrap_err();
        assert!(e.contains(why) && e.contains("--key"), "{bad:?}: {e}");
    }
}
