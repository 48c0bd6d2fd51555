//! The request vocabulary: `decide` answers, for every request, exactly what the
//! request's named transition answers, and requests, replies and refusals survive
//! serde.

mod common;

use common::*;
use leasehold_engine::transition::{self, Continued, ReconcileOutcome};
use leasehold_engine::{
    decide, AttemptRecord, ClaimRequest, LeaseToken, Op, OperatorRequest, Plan, Recovery, Refusal, Reply, Request,
    Timestamp, WorkerRequest, Writes,
};
use proptest::prelude::*;

fn worker_writes(record: &AttemptRecord, request: &WorkerRequest, token: &LeaseToken, now: Timestamp) -> Writes {
    let (writes, _) = allowed(decide(record, Request::Worker(request, token, None), now));
    writes
}

#[test]
fn each_worker_request_is_its_transition() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let now = at(begin_ms(2) + 200);
    let token = token_a();

    let heartbeat = WorkerRequest::Heartbeat { lease_ms: LEASE_MS };
    let (writes, reply) = allowed(decide(&record, Request::Worker(&heartbeat, &token, None), now));
    assert_eq!(
        writes,
        allowed(transition::heartbeat(&record.command, &token, LEASE_MS, now))
    );
    assert_eq!(
        reply,
        Reply::Renewed {
            until: now.plus_ms(LEASE_MS)
        }
    );

    let complete = WorkerRequest::CompleteStep {
        ordinal: 2,
        evidence: evidence(2),
        target_receipt: target_receipt(2),
        lease_ms: LEASE_MS,
    };
    assert_eq!(
        worker_writes(&record, &complete, &token, now),
        allowed(transition::complete_step(
            &record,
            2,
            &evidence(2),
            &target_receipt(2),
            &token,
            LEASE_MS,
            now
        ))
    );

    let cont = WorkerRequest::CompleteAndContinue {
        ordinal: 2,
        evidence: evidence(2),
        target_receipt: target_receipt(2),
        lease_ms: LEASE_MS,
    };
    let (writes, reply) = allowed(decide(&record, Request::Worker(&cont, &token, None), now));
    let (continued, expected) = allowed(transition::complete_and_continue(
        &record,
        2,
        &evidence(2),
        &target_receipt(2),
        &token,
        LEASE_MS,
        now,
    ));
    assert_eq!((writes, reply), (expected, Reply::Continued(continued)));
    assert_eq!(continued, Continued::Began(3));

    let fail = WorkerRequest::Fail {
        ordinal: Some(2),
        error: "no".into(),
    };
    assert_eq!(
        worker_writes(&record, &fail, &token, now),
        allowed(transition::fail(&record, Some(2), "no", &token, now))
    );

    let begun_record = in_progress(&plan, 1, false);
    let begin = WorkerRequest::BeginStep {
        ordinal: 2,
        lease_ms: LEASE_MS,
    };
    assert_eq!(
        worker_writes(&begun_record, &begin, &token, now),
        allowed(transition::begin_step(&begun_record, 2, &token, LEASE_MS, now))
    );

    let done = in_progress(&plan, plan.steps.len() as u32, false);
    let (writes, reply) = allowed(decide(
        &done,
        Request::Worker(&WorkerRequest::Finish, &token, None),
        now,
    ));
    assert_eq!(writes, allowed(transition::finish(&done, &token, now)));
    assert_eq!(reply, Reply::Applied);
}

#[test]
fn a_worker_request_under_a_stale_token_is_refused_like_its_transition() {
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let now = at(begin_ms(2) + 200);
    let stale = token_b();
    let finish = refused(decide(
        &record,
        Request::Worker(&WorkerRequest::Finish, &stale, None),
        now,
    ));
    assert_eq!(finish, refused(transition::finish(&record, &stale, now)));
    assert!(matches!(finish, Refusal::StaleToken { .. }), "{finish:?}");
}

#[test]
fn claims_are_the_claim_transitions() {
    for recovery in [Recovery::Resume, Recovery::Replay] {
        let plan = plan(recovery, &["a", "b"]);
        let record = enqueued(&plan);
        let now = at(CLAIMED_MS);
        for begin in [false, true] {
            let request = ClaimRequest {
                owner: OWNER_A.into(),
                batch: 5,
                lease_ms: LEASE_MS,
                begin,
                capabilities: None,
            };
            let (writes, reply) = allowed(decide(&record, Request::Claim(&request, &token_a(), &plan), now));
            let expected = if begin {
                transition::claim_and_begin(&record, recovery, OWNER_A, token_a(), LEASE_MS, now)
            } else {
                transition::claim(&record, recovery, OWNER_A, token_a(), LEASE_MS, now)
            };
            assert_eq!(writes, allowed(expected));
            assert_eq!(reply, Reply::Applied);
            assert_eq!(Request::Claim(&request, &token_a(), &plan).op().as_str(), {
                if begin {
                    "claim-and-begin"
                } else {
                    "claim"
                }
            });
        }
    }
}

#[test]
fn operator_requests_are_reconcile_and_abort() {
    let plan = replay_plan();
    let record = in_progress(&plan, 1, true);
    let later = at(expired_after(begin_ms(2)));
    let (writes, reply) = allowed(decide(
        &record,
        Request::Operator(&OperatorRequest::Reconcile, plan.recovery),
        later,
    ));
    let (outcome, expected) = allowed(transition::reconcile(&record, plan.recovery, later));
    assert_eq!((writes, reply), (expected, Reply::Reconciled(outcome)));
    assert_eq!(outcome, ReconcileOutcome::Requeued);

    // A live lease: both refuse it alike.
    let live = at(begin_ms(2) + 10);
    assert_eq!(
        refused(decide(
            &record,
            Request::Operator(&OperatorRequest::Reconcile, plan.recovery),
            live
        )),
        refused(transition::reconcile(&record, plan.recovery, live))
    );

    let abort = OperatorRequest::Abort {
        reason: "operator stop".into(),
    };
    let (writes, reply) = allowed(decide(&record, Request::Operator(&abort, plan.recovery), live));
    assert_eq!(writes, allowed(transition::abort(&record, "operator stop", live)));
    assert_eq!(reply, Reply::Applied);
}

#[test]
fn requests_replies_and_refusals_survive_serde() {
    let requests = vec![
        WorkerRequest::Heartbeat { lease_ms: 5 },
        WorkerRequest::BeginStep {
            ordinal: 2,
            lease_ms: 5,
        },
        WorkerRequest::CompleteStep {
            ordinal: 2,
            evidence: evidence(2),
            target_receipt: target_receipt(2),
            lease_ms: 5,
        },
        WorkerRequest::CompleteAndContinue {
            ordinal: 1,
            evidence: evidence(1),
            target_receipt: target_receipt(1),
            lease_ms: 5,
        },
        WorkerRequest::Fail {
            ordinal: None,
            error: "e".into(),
        },
        WorkerRequest::Finish,
    ];
    for r in &requests {
        let text = serde_json::to_string(r).unwrap();
        assert_eq!(&serde_json::from_str::<WorkerRequest>(&text).unwrap(), r, "{text}");
    }
    for r in [
        OperatorRequest::Reconcile,
        OperatorRequest::Abort { reason: "why".into() },
    ] {
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<OperatorRequest>(&text).unwrap(), r, "{text}");
    }
    for r in [
        Reply::Applied,
        Reply::Renewed { until: at(9) },
        Reply::Continued(Continued::Began(2)),
        Reply::Continued(Continued::Finished),
        Reply::Reconciled(ReconcileOutcome::Unchanged),
    ] {
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Reply>(&text).unwrap(), r, "{text}");
    }
    let plan = resume_plan();
    let record = in_progress(&plan, 1, true);
    let refusals = [
        refused(transition::finish(&record, &token_b(), at(1))),
        refused(transition::reconcile(&record, plan.recovery, at(begin_ms(2)))),
        refused(transition::finish(&record, &token_a(), at(1))),
        refused(transition::abort(&delivered(&plan), "late", at(1))),
    ];
    for r in refusals {
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Refusal>(&text).unwrap(), r, "{text}");
    }
}

/// A record somewhere on worker A's run of a three-step plan, or terminal.
fn some_record(plan: &Plan, succeeded: u32, running: bool, terminal: u8) -> AttemptRecord {
    match terminal {
        1 => delivered(plan),
        2 => failed_at(plan, 2),
        3 => aborted_while_running(plan, 2),
        _ if succeeded == 0 && !running => enqueued(plan),
        _ => in_progress(plan, succeeded.min(2), running),
    }
}

fn named(
    (record, plan): (&AttemptRecord, &Plan),
    request: &WorkerRequest,
    token: &LeaseToken,
    now: Timestamp,
) -> Result<Writes, Refusal> {
    match request {
        WorkerRequest::Heartbeat { lease_ms } => transition::heartbeat(&record.command, token, *lease_ms, now),
        WorkerRequest::BeginStep { ordinal, lease_ms } => {
            transition::begin_step(record, *ordinal, token, *lease_ms, now)
        }
        WorkerRequest::CompleteStep {
            ordinal,
            evidence,
            target_receipt,
            lease_ms,
        } => transition::complete_step(record, *ordinal, evidence, target_receipt, token, *lease_ms, now),
        WorkerRequest::CompleteAndContinue {
            ordinal,
            evidence,
            target_receipt,
            lease_ms,
        } => transition::complete_and_continue(record, *ordinal, evidence, target_receipt, token, *lease_ms, now)
            .map(|(_, w)| w),
        WorkerRequest::Fail { ordinal, error } => transition::fail(record, *ordinal, error, token, now),
        WorkerRequest::Finish => transition::finish(record, token, now),
        WorkerRequest::GiveBack { error, delay_ms } => {
            transition::give_back(record, plan, error, *delay_ms, token, now).map(|(_, w)| w)
        }
    }
}

fn worker_request(kind: u8, ordinal: u32) -> WorkerRequest {
    match kind {
        0 => WorkerRequest::Heartbeat { lease_ms: LEASE_MS },
        1 => WorkerRequest::BeginStep {
            ordinal,
            lease_ms: LEASE_MS,
        },
        2 => WorkerRequest::CompleteStep {
            ordinal,
            evidence: evidence(ordinal),
            target_receipt: target_receipt(ordinal),
            lease_ms: LEASE_MS,
        },
        3 => WorkerRequest::CompleteAndContinue {
            ordinal,
            evidence: evidence(ordinal),
            target_receipt: target_receipt(ordinal),
            lease_ms: LEASE_MS,
        },
        6 => WorkerRequest::GiveBack {
            error: "busy".into(),
            delay_ms: u64::from(ordinal) * 700,
        },
        4 => WorkerRequest::Fail {
            ordinal: (!ordinal.is_multiple_of(4)).then_some(ordinal),
            error: "boom".into(),
        },
        _ => WorkerRequest::Finish,
    }
}

proptest! {
    /// Whatever the state, token, instant and request: `decide` answers the named
    /// transition's writes or its refusal.
    #[test]
    fn decide_is_the_named_transition(
        replay in any::<bool>(),
        succeeded in 0u32..3,
        running in any::<bool>(),
        terminal in 0u8..6,
        stale in any::<bool>(),
        kind in 0u8..10,
        ordinal in 0u32..5,
        offset in 0i64..100_000,
    ) {
        let recovery = if replay { Recovery::Replay } else { Recovery::Resume };
        let plan = plan(recovery, &["a", "b", "c"]);
        let record = some_record(&plan, succeeded, running, terminal);
        let now = at(CLAIMED_MS + offset);
        let token = if stale { token_b() } else { token_a() };
        match kind {
            0..=6 => {
                let request = worker_request(kind, ordinal);
                let decided = decide(&record, Request::Worker(&request, &token, Some(&plan)), now).map(|(w, _)| w);
                prop_assert_eq!(decided, named((&record, &plan), &request, &token, now));
            }
            7 | 8 => {
                let claim = ClaimRequest { owner: OWNER_B.into(), batch: 1, lease_ms: LEASE_MS, begin: kind == 8, capabilities: None };
                let decided = decide(&record, Request::Claim(&claim, &token, &plan), now).map(|(w, _)| w);
                let expected = if claim.begin {
                    transition::claim_and_begin(&record, recovery, OWNER_B, token.clone(), LEASE_MS, now)
                } else {
                    transition::claim(&record, recovery, OWNER_B, token.clone(), LEASE_MS, now)
                };
                prop_assert_eq!(decided, expected);
            }
            _ => {
                let reconcile = decide(&record, Request::Operator(&OperatorRequest::Reconcile, recovery), now);
                let expected = transition::reconcile(&record, recovery, now);
                prop_assert_eq!(
                    reconcile.map(|(w, reply)| (reply, w)),
                    expected.map(|(o, w)| (Reply::Reconciled(o), w))
                );
                let abort = OperatorRequest::Abort { reason: "stop".into() };
                let decided = decide(&record, Request::Operator(&abort, recovery), now).map(|(w, _)| w);
                prop_assert_eq!(decided, transition::abort(&record, "stop", now));
            }
        }
    }
}

#[test]
fn each_request_names_itself_its_receipt_and_its_lease() {
    let complete = |ordinal| WorkerRequest::CompleteStep {
        ordinal,
        evidence: evidence(ordinal),
        target_receipt: target_receipt(ordinal),
        lease_ms: 7,
    };
    let cont = WorkerRequest::CompleteAndContinue {
        ordinal: 3,
        evidence: evidence(3),
        target_receipt: target_receipt(3),
        lease_ms: 8,
    };
    let cases: Vec<(WorkerRequest, &str, Option<u32>, Option<u64>)> = vec![
        (WorkerRequest::Heartbeat { lease_ms: 5 }, "heartbeat", None, Some(5)),
        (
            WorkerRequest::BeginStep {
                ordinal: 2,
                lease_ms: 6,
            },
            "begin-step",
            Some(2),
            Some(6),
        ),
        (complete(4), "complete-step", Some(4), Some(7)),
        (cont, "complete-and-continue", Some(3), Some(8)),
        (
            WorkerRequest::Fail {
                ordinal: Some(5),
                error: "no".into(),
            },
            "fail",
            Some(5),
            None,
        ),
        (
            WorkerRequest::Fail {
                ordinal: None,
                error: "no".into(),
            },
            "fail",
            None,
            None,
        ),
        (WorkerRequest::Finish, "finish", None, None),
        (
            WorkerRequest::GiveBack {
                error: "busy".into(),
                delay_ms: 10,
            },
            "give-back",
            None,
            None,
        ),
    ];
    let token = token_a();
    for (request, op, ordinal, lease_ms) in cases {
        assert_eq!(request.op().as_str(), op);
        assert_eq!(request.ordinal(), ordinal, "{op}");
        assert_eq!(request.lease_ms(), lease_ms, "{op}");
        assert_eq!(Request::Worker(&request, &token, None).op().as_str(), op);
    }
    for (request, op) in [
        (OperatorRequest::Reconcile, "reconcile"),
        (OperatorRequest::Abort { reason: "stop".into() }, "abort"),
    ] {
        assert_eq!(request.op().as_str(), op);
        assert_eq!(Request::Operator(&request, Recovery::Resume).op().as_str(), op);
    }
    for (begin, op) in [(false, "claim"), (true, "claim-and-begin")] {
        let claim = ClaimRequest {
            owner: "w".into(),
            batch: 1,
            lease_ms: 1,
            begin,
            capabilities: None,
        };
        let plan = plan(Recovery::Replay, &["a"]);
        assert_eq!(Request::Claim(&claim, &token, &plan).op().as_str(), op);
    }
}

#[test]
fn every_op_prints_its_one_spelling_and_knows_its_kind() {
    let spelled: Vec<String> = Op::ALL.iter().map(ToString::to_string).collect();
    assert_eq!(
        spelled,
        [
            "enqueue",
            "claim",
            "claim-and-begin",
            "heartbeat",
            "begin-step",
            "complete-step",
            "complete-and-continue",
            "fail",
            "finish",
            "give-back",
            "reconcile",
            "abort",
            "release"
        ]
    );
    assert_eq!(format!("{:>8}|{:<8}|", Op::Fail, Op::Abort), "    fail|abort   |");
    let of = |pick: fn(Op) -> bool| Op::ALL.into_iter().filter(|o| pick(*o)).collect::<Vec<_>>();
    assert_eq!(of(Op::is_claim), [Op::Claim, Op::ClaimAndBegin]);
    assert_eq!(of(Op::completes_step), [Op::CompleteStep, Op::CompleteAndContinue]);
    assert_eq!(
        of(Op::is_worker),
        [
            Op::Heartbeat,
            Op::BeginStep,
            Op::CompleteStep,
            Op::CompleteAndContinue,
            Op::Fail,
            Op::Finish,
            Op::GiveBack
        ]
    );
}

#[test]
fn writes_are_empty_only_when_no_row_changes() {
    let record = delivered(&resume_plan());
    let none = Writes {
        guard: leasehold_engine::Guard::Absent,
        attempt: None,
        command: None,
        receipts: Vec::new(),
    };
    assert!(none.is_empty());
    let attempt = Writes {
        attempt: Some(record.attempt.clone()),
        ..none.clone()
    };
    let command = Writes {
        command: Some(record.command.clone()),
        ..none.clone()
    };
    let receipts = Writes {
        receipts: record.receipts.clone(),
        ..none.clone()
    };
    for (what, writes) in [("attempt", attempt), ("command", command), ("receipts", receipts)] {
        assert!(!writes.is_empty(), "{what}");
    }
}
