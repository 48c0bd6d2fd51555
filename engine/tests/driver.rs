//! The worker driver on a virtual clock: scripted inputs, exact outputs.
//!
//! Times are plain [`Timestamp`]s in milliseconds. The lease is 3 s, so heartbeats
//! are due every second after the last renewal. The driver is the fused one: the
//! claim began the first step (unless a test says the claim left it PENDING), and
//! each completion begins the next step or finishes the attempt, as the ledger's
//! [`Continued`] answer says.

mod common;

use leasehold_engine::driver::{
    Deadline, DeadlineReason, Driver, DriverAction, ExecutorResult, Outcome, EXECUTOR_ATTEMPTS_MAX,
};
use leasehold_engine::lease::{heartbeat_ms, MAX_EVIDENCE_BYTES};
use leasehold_engine::transition::Continued;
use leasehold_engine::{
    AttemptRecord, CommandId, CommandStatus, Exhaustion, Failure, Plan, PlanId, PlanSpec, ReceiptStatus, Recovery,
    Refusal, Reply, Timestamp, WorkerRequest,
};
use serde_json::{json, Value};

const LEASE_MS: u64 = 3_000;
const HEARTBEAT_MS: i64 = 1_000;

fn t(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

/// `steps` receipts, all PENDING: a claim that began nothing.
fn pending(steps: u32) -> Vec<(u32, ReceiptStatus)> {
    (1..=steps).map(|o| (o, ReceiptStatus::Pending)).collect()
}

/// `steps` receipts as a claim-and-begin leaves a fresh attempt: step 1 RUNNING.
fn running(steps: u32) -> Vec<(u32, ReceiptStatus)> {
    let mut receipts = pending(steps);
    receipts[0].1 = ReceiptStatus::Running;
    receipts
}

/// The claimed attempt (worker A's first delivery) with these receipt statuses, in
/// this order.
fn claimed(receipts: &[(u32, ReceiptStatus)]) -> AttemptRecord {
    let steps = receipts.iter().map(|(o, _)| *o).max().unwrap_or(0);
    let codes: Vec<String> = (1..=steps).map(|o| format!("step-{o}")).collect();
    let codes: Vec<&str> = codes.iter().map(String::as_str).collect();
    let mut record = common::claimed(&common::plan(Recovery::Resume, &codes));
    let all = std::mem::take(&mut record.receipts);
    record.receipts = receipts
        .iter()
        .map(|(ordinal, status)| {
            let mut r = all[*ordinal as usize - 1].clone();
            r.status = *status;
            r
        })
        .collect();
    record
}

/// A one-step plan whose `[retry]` table is `retry`.
fn policy_plan(retry: Value) -> Plan {
    let spec: PlanSpec = serde_json::from_value(json!({
        "name": "policy",
        "recovery": "resume",
        "retry": retry,
        "steps": [{"code": "step-1", "executor": common::EXECUTOR}],
    }))
    .expect("the spec is well formed");
    spec.into_plan(&[common::EXECUTOR], PlanId::new("plan-p"), t(0))
        .expect("the spec is valid")
}

/// `plan`'s attempt as a claim-and-begin leaves it: the first of `steps` RUNNING.
fn claimed_of(plan: &Plan, steps: u32) -> AttemptRecord {
    let mut record = common::claimed(plan);
    for r in &mut record.receipts {
        if r.ordinal == 1 {
            r.status = ReceiptStatus::Running;
        }
    }
    assert_eq!(record.receipts.len() as u32, steps);
    record
}

/// The attempt as a read-back finds it: ended with `status`, last held by `owner`
/// in delivery `delivery`.
fn read_back(status: CommandStatus, owner: &str, delivery: u32) -> AttemptRecord {
    let mut record = claimed(&running(2));
    record.command.status = status;
    record.command.lease_owner = Some(owner.to_owned());
    record.command.lease_token = None;
    record.command.delivery_count = delivery;
    record
}

fn evidence(ordinal: u32) -> Value {
    json!({"step": ordinal})
}

fn target_receipt(ordinal: u32) -> Value {
    json!({"ack": ordinal})
}

fn done(ordinal: u32) -> ExecutorResult {
    ExecutorResult::Done {
        evidence: evidence(ordinal),
        target_receipt: target_receipt(ordinal),
    }
}

fn begin(ordinal: u32) -> DriverAction {
    DriverAction::Ledger(WorkerRequest::BeginStep {
        ordinal,
        lease_ms: LEASE_MS,
    })
}

fn execute(ordinal: u32) -> DriverAction {
    DriverAction::Execute { ordinal }
}

fn complete(ordinal: u32) -> DriverAction {
    DriverAction::Ledger(WorkerRequest::CompleteAndContinue {
        ordinal,
        evidence: evidence(ordinal),
        target_receipt: target_receipt(ordinal),
        lease_ms: LEASE_MS,
    })
}

fn heartbeat() -> DriverAction {
    DriverAction::Ledger(WorkerRequest::Heartbeat { lease_ms: LEASE_MS })
}

fn finish() -> DriverAction {
    DriverAction::Ledger(WorkerRequest::Finish)
}

fn read() -> DriverAction {
    DriverAction::ReadAttempt
}

fn stale() -> Refusal {
    Refusal::StaleToken {
        command: CommandId::new("cmd-1"),
    }
}

/// A driver on a virtual clock, with a log of every action it asked for.
struct Harness {
    driver: Driver,
    now: i64,
    log: Vec<DriverAction>,
}

impl Harness {
    fn of(driver: Driver) -> Self {
        Self {
            driver,
            now: 0,
            log: Vec::new(),
        }
    }

    fn new(receipts: &[(u32, ReceiptStatus)], now: i64) -> Self {
        Self {
            driver: Driver::fused(&claimed(receipts), LEASE_MS, t(now)),
            now,
            log: Vec::new(),
        }
    }

    /// A harness whose driver holds each step's evidence to `cap` bytes.
    fn with_evidence_cap(receipts: &[(u32, ReceiptStatus)], cap: usize) -> Self {
        let mut h = Self::new(receipts, 0);
        h.driver = Driver::fused(&claimed(receipts), LEASE_MS, t(0)).with_max_evidence_bytes(cap);
        h
    }

    /// Drains `poll_action` at the current time.
    fn poll(&mut self) -> Vec<DriverAction> {
        let mut actions = Vec::new();
        while let Some(action) = self.driver.poll_action(t(self.now)) {
            actions.push(action);
            assert!(actions.len() < 8, "poll_action never returned None: {actions:?}");
        }
        self.log.extend(actions.iter().cloned());
        actions
    }

    fn at(&mut self, ms: i64) -> &mut Self {
        assert!(ms >= self.now, "the virtual clock never goes back");
        self.now = ms;
        self
    }

    fn later(&mut self, ms: i64) -> &mut Self {
        self.at(self.now + ms)
    }

    fn reply(&mut self, reply: Reply) {
        self.driver.handle_reply(t(self.now), reply);
    }

    fn fail(&mut self, failure: Failure) {
        self.driver.handle_failure(t(self.now), failure);
    }

    /// The read-back found the attempt as `record` holds it.
    fn read_back(&mut self, record: &AttemptRecord) {
        self.driver.handle_read(t(self.now), record);
    }

    /// The last request sent was applied: a heartbeat renewed, anything else
    /// [`Reply::Applied`] (which a completion is not answered with).
    fn commit(&mut self) {
        let last = self
            .log
            .iter()
            .rev()
            .find(|a| !matches!(a, DriverAction::Execute { .. }));
        let reply = match last {
            Some(DriverAction::Ledger(WorkerRequest::Heartbeat { .. })) => Reply::Renewed {
                until: t(self.now + LEASE_MS as i64),
            },
            _ => Reply::Applied,
        };
        self.reply(reply);
    }

    /// A completion committed and the ledger began step `next`.
    fn began(&mut self, next: u32) {
        self.reply(Reply::Continued(Continued::Began(next)));
    }

    /// The last completion committed and the ledger finished the attempt.
    fn finished(&mut self) {
        self.reply(Reply::Continued(Continued::Finished));
    }

    fn ledger_error(&mut self) {
        self.fail(Failure::Unavailable);
    }

    fn reply_lost(&mut self) {
        self.fail(Failure::Ambiguous);
    }

    fn refuse(&mut self) {
        self.fail(Failure::Refused(stale()));
    }

    fn executed(&mut self, ordinal: u32, result: ExecutorResult) {
        self.driver.handle_executed(t(self.now), ordinal, result);
    }

    fn deadline(&self) -> Deadline {
        self.driver
            .poll_timeout()
            .expect("a running driver always has a deadline")
    }

    /// Sleeps until the next deadline (at once if it has passed) and fires it.
    fn fire(&mut self) -> Deadline {
        let deadline = self.deadline();
        self.at(deadline.at.as_millis().max(self.now));
        self.driver.handle_timeout(t(self.now));
        deadline
    }

    fn outcome(&self) -> Option<&Outcome> {
        self.driver.outcome()
    }

    /// Runs one begun step: execute (answered with `result` after 100 ms), and
    /// returns what the driver asked for next.
    fn run_step(&mut self, ordinal: u32, result: ExecutorResult) -> Vec<DriverAction> {
        assert_eq!(self.poll(), [execute(ordinal)]);
        self.later(100).executed(ordinal, result);
        self.poll()
    }

    fn assert_stopped(&mut self) {
        assert!(self.outcome().is_some());
        assert_eq!(self.poll(), [], "no action after the outcome");
        assert_eq!(self.driver.poll_timeout(), None, "no deadline after the outcome");
        self.driver.handle_timeout(t(self.now + 100_000));
        assert_eq!(self.poll(), []);
    }
}

#[test]
fn the_happy_path_executes_each_step_and_each_completion_continues_until_the_last_delivers() {
    let mut h = Harness::new(&running(3), 0);
    assert_eq!(h.outcome(), None);
    assert_eq!(h.poll(), [execute(1)], "the claim began step 1");
    assert!(!h.driver.awaiting_ledger());
    assert_eq!(h.driver.executing(), Some(1));
    h.at(100).executed(1, done(1));
    assert_eq!(h.driver.executing(), None);
    assert_eq!(h.poll(), [complete(1)]);
    assert!(h.driver.awaiting_ledger());
    h.at(110).began(2);
    assert!(!h.driver.awaiting_ledger());
    assert_eq!(h.run_step(2, done(2)), [complete(2)]);
    h.later(5).began(3);
    assert_eq!(h.run_step(3, done(3)), [complete(3)]);
    assert_eq!(h.outcome(), None, "not delivered before the last completion commits");
    h.later(5).finished();
    assert_eq!(h.outcome(), Some(&Outcome::Delivered));
    assert_eq!(
        h.log,
        [
            execute(1),
            complete(1),
            execute(2),
            complete(2),
            execute(3),
            complete(3),
        ],
        "n steps take n transactions after the claim"
    );
    h.assert_stopped();
}

#[test]
fn a_step_the_claim_left_pending_is_begun_first() {
    let mut h = Harness::new(&pending(2), 0);
    assert_eq!(h.poll(), [begin(1)]);
    assert_eq!(h.poll(), [], "nothing else while the begin is in flight");
    h.at(5).commit();
    assert_eq!(h.run_step(1, done(1)), [complete(1)]);
    h.later(5).began(2);
    assert_eq!(h.poll(), [execute(2)], "a completion's continuation needs no begin");
}

#[test]
fn heartbeats_are_scheduled_every_third_of_the_lease_while_an_executor_runs() {
    assert_eq!(heartbeat_ms(LEASE_MS) as i64, HEARTBEAT_MS);
    let mut h = Harness::new(&running(2), 0);
    assert_eq!(h.poll(), [execute(1)]);
    // The executor runs for 4.5 s, longer than the lease itself.
    for beat in 1..=4 {
        let due = beat * HEARTBEAT_MS;
        assert_eq!(
            h.deadline(),
            Deadline {
                at: t(due),
                reason: DeadlineReason::Heartbeat
            }
        );
        h.fire();
        assert_eq!(h.poll(), [heartbeat()]);
        assert_eq!(h.poll(), [], "one heartbeat at a time");
        assert_eq!(
            h.deadline(),
            Deadline {
                at: t(due + LEASE_MS as i64 - HEARTBEAT_MS),
                reason: DeadlineReason::LeaseExpiry
            },
            "while the heartbeat is in flight only the lease estimate is pending"
        );
        h.later(40).commit();
    }
    h.at(4_500).executed(1, done(1));
    assert_eq!(h.poll(), [complete(1)]);
    h.later(10).began(2);
    assert_eq!(h.poll(), [execute(2)]);
    // A completion renews the lease too: the next heartbeat is a third of a lease
    // after the completion was sent.
    assert_eq!(
        h.deadline(),
        Deadline {
            at: t(4_500 + HEARTBEAT_MS),
            reason: DeadlineReason::Heartbeat
        }
    );
    assert_eq!(h.outcome(), None);
}

#[test]
fn the_renewal_is_measured_from_when_the_request_was_sent_not_when_it_committed() {
    let mut h = Harness::new(&running(1), 0);
    assert_eq!(h.poll(), [execute(1)]);
    h.fire();
    assert_eq!(h.poll(), [heartbeat()]);
    h.at(1_900).commit();
    assert_eq!(h.deadline().at, t(2 * HEARTBEAT_MS));
}

#[test]
fn poll_action_returns_none_while_a_ledger_request_is_in_flight() {
    let mut h = Harness::new(&pending(2), 0);
    assert_eq!(h.poll(), [begin(1)]);
    // Time passes with the begin unanswered: a heartbeat falls due but waits.
    h.at(HEARTBEAT_MS);
    h.driver.handle_timeout(t(h.now));
    assert_eq!(h.poll(), []);
    assert!(h.driver.awaiting_ledger());
    h.later(10).commit();
    assert_eq!(h.poll(), [execute(1)], "the committed begin renewed the lease");

    // A heartbeat in flight holds back the completion the executor just answered.
    let due = h.deadline();
    assert_eq!(due.reason, DeadlineReason::Heartbeat);
    h.fire();
    assert_eq!(h.poll(), [heartbeat()]);
    h.later(1).executed(1, done(1));
    assert_eq!(h.poll(), []);
    h.later(1).commit();
    assert_eq!(h.poll(), [complete(1)]);
    assert_eq!(h.poll(), []);
    h.later(1).began(2);
    assert_eq!(h.poll(), [execute(2)]);
}

#[test]
fn a_refused_begin_stops_the_driver_at_once() {
    let mut h = Harness::new(&pending(3), 0);
    assert_eq!(h.poll(), [begin(1)]);
    h.later(5).refuse();
    assert_eq!(h.outcome(), Some(&Outcome::Refused(stale())));
    h.later(5).executed(1, done(1));
    h.commit();
    h.assert_stopped();
    assert_eq!(h.log, [begin(1)]);
}

#[test]
fn a_refused_heartbeat_stops_the_driver_and_the_late_executor_result_is_dropped() {
    let mut h = Harness::new(&running(2), 0);
    assert_eq!(h.poll(), [execute(1)]);
    h.fire();
    assert_eq!(h.poll(), [heartbeat()]);
    h.later(5).refuse();
    assert_eq!(h.outcome(), Some(&Outcome::Refused(stale())));
    h.later(100).executed(1, done(1));
    h.assert_stopped();
    assert!(!h.log.contains(&complete(1)), "nothing is written after a refusal");
}

#[test]
fn a_refused_completion_stops_the_driver() {
    let mut h = Harness::new(&running(2), 0);
    assert_eq!(h.run_step(1, done(1)), [complete(1)]);
    h.later(5).refuse();
    assert!(matches!(h.outcome(), Some(Outcome::Refused(_))));
    h.assert_stopped();
}

#[test]
fn a_resume_claim_with_two_succeeded_steps_starts_at_step_3() {
    let receipts = [
        (1, ReceiptStatus::Succeeded),
        (2, ReceiptStatus::Succeeded),
        (3, ReceiptStatus::Running),
    ];
    let mut h = Harness::new(&receipts, 0);
    assert_eq!(h.run_step(3, done(3)), [complete(3)]);
    h.later(5).finished();
    assert_eq!(h.outcome(), Some(&Outcome::Delivered));
    assert_eq!(h.log, [execute(3), complete(3)]);
}

#[test]
fn the_first_unfinished_step_is_found_whatever_order_the_receipts_come_in() {
    let receipts = [
        (4, ReceiptStatus::Pending),
        (2, ReceiptStatus::Succeeded),
        (3, ReceiptStatus::Pending),
        (1, ReceiptStatus::Succeeded),
    ];
    let mut h = Harness::new(&receipts, 0);
    assert_eq!(h.poll(), [begin(3)]);
    h.later(5).commit();
    assert_eq!(h.run_step(3, done(3)), [complete(3)]);
    h.later(5).began(4);
    assert_eq!(h.poll(), [execute(4)]);
}

#[test]
fn a_claim_whose_steps_all_succeeded_finishes_first() {
    let receipts = [(1, ReceiptStatus::Succeeded), (2, ReceiptStatus::Succeeded)];
    let mut h = Harness::new(&receipts, 0);
    assert_eq!(h.poll(), [finish()]);
    h.at(5).commit();
    assert_eq!(h.outcome(), Some(&Outcome::Delivered));
    h.assert_stopped();
}

#[test]
fn a_permanent_executor_failure_fails_the_attempt() {
    let mut h = Harness::new(&running(3), 0);
    assert_eq!(h.run_step(1, done(1)), [complete(1)]);
    h.later(5).began(2);
    let next = h.run_step(2, ExecutorResult::Permanent("table app_user already exists".into()));
    let error = "step 2: table app_user already exists".to_owned();
    assert_eq!(
        next,
        [DriverAction::Ledger(WorkerRequest::Fail {
            ordinal: Some(2),
            error: error.clone()
        })]
    );
    assert_eq!(h.outcome(), None, "not failed before the fail commits");
    h.later(5).commit();
    assert_eq!(h.outcome(), Some(&Outcome::Failed(error)));
    h.assert_stopped();
    assert!(!h.log.contains(&execute(3)));
}

/// The give-back the driver asks for next: its error and delay.
fn gives_back(h: &mut Harness) -> (String, u64) {
    match h.poll().as_slice() {
        [DriverAction::Ledger(WorkerRequest::GiveBack { error, delay_ms })] => (error.clone(), *delay_ms),
        other => panic!("expected a give-back, got {other:?}"),
    }
}

#[test]
fn transient_failures_retry_with_backoff_then_give_the_command_back() {
    let mut h = Harness::new(&running(2), 0);
    let mut backoffs = Vec::new();
    for call in 1..=EXECUTOR_ATTEMPTS_MAX {
        assert_eq!(h.poll(), [execute(1)], "call {call}");
        h.later(10)
            .executed(1, ExecutorResult::Transient("connection reset".into()));
        if call == EXECUTOR_ATTEMPTS_MAX {
            break;
        }
        assert_eq!(h.outcome(), None);
        assert_eq!(h.poll(), [], "no retry before the backoff");
        let retry = h.deadline();
        assert_eq!(retry.reason, DeadlineReason::RetryExecutor);
        backoffs.push(retry.at.as_millis() - h.now);
        h.at(retry.at.as_millis() - 1);
        h.driver.handle_timeout(t(h.now));
        assert_eq!(h.poll(), []);
        h.fire();
    }
    assert!(
        backoffs.windows(2).all(|w| w[1] > w[0]),
        "the backoff grows: {backoffs:?}"
    );
    let calls = h.log.iter().filter(|a| **a == execute(1)).count();
    assert_eq!(calls, EXECUTOR_ATTEMPTS_MAX as usize);
    let (error, delay_ms) = gives_back(&mut h);
    assert!(
        error.contains("step 1") && error.contains("connection reset") && error.contains("3 tries"),
        "{error}"
    );
    // Without a plan's policy: the default window of a first delivery, no jitter.
    assert_eq!(delay_ms, 0);
    let until = t(h.now + 1_000);
    h.later(5).reply(Reply::GaveBack { until });
    assert_eq!(h.outcome(), Some(&Outcome::GaveBack { until, error }));
    h.assert_stopped();
    assert!(
        !h.log
            .iter()
            .any(|a| matches!(a, DriverAction::Ledger(WorkerRequest::Fail { .. }))),
        "a transient failure never fails the attempt"
    );
}

#[test]
fn the_plans_policy_sets_the_tries_and_the_jittered_backoff_of_a_give_back() {
    let plan = policy_plan(json!({"step_max_tries": 1, "backoff_base_ms": 400, "backoff_max_ms": 400}));
    let record = claimed_of(&plan, 1);
    let mut h = Harness::of(Driver::fused(&record, LEASE_MS, t(0)).with_policy(&plan, 250));
    assert_eq!(h.poll(), [execute(1)]);
    h.later(10).executed(1, ExecutorResult::Transient("busy".into()));
    assert_eq!(
        gives_back(&mut h).1,
        250,
        "one try, then jitter 250 in the window 0..=400"
    );
}

#[test]
fn a_throttled_answer_gives_back_at_once_for_at_least_the_asked_delay_within_the_max() {
    let plan = policy_plan(json!({"backoff_base_ms": 100, "backoff_max_ms": 5_000}));
    let record = claimed_of(&plan, 1);
    let mut h = Harness::of(Driver::fused(&record, LEASE_MS, t(0)).with_policy(&plan, 0));
    assert_eq!(h.poll(), [execute(1)]);
    let throttled = |ms| ExecutorResult::Throttled {
        error: "answered 429".into(),
        retry_after_ms: ms,
    };
    h.later(10).executed(1, throttled(3_000));
    let (error, delay_ms) = gives_back(&mut h);
    assert_eq!(
        (delay_ms, error.as_str()),
        (3_000, "step 1: answered 429"),
        "given back at once"
    );
    let mut h = Harness::of(Driver::fused(&record, LEASE_MS, t(0)).with_policy(&plan, 0));
    assert_eq!(h.poll(), [execute(1)]);
    h.later(10).executed(1, throttled(86_400_000));
    assert_eq!(
        gives_back(&mut h).1,
        5_000,
        "Retry-After is honoured up to backoff_max_ms"
    );
}

/// A one-step delivery whose step failed transiently on every try, asking to give
/// the command back.
fn given_back_after_its_tries() -> Harness {
    let mut h = Harness::new(&running(1), 0);
    for _ in 0..EXECUTOR_ATTEMPTS_MAX {
        assert_eq!(h.poll(), [execute(1)]);
        h.later(10).executed(1, ExecutorResult::Transient("busy".into()));
        if h.driver
            .poll_timeout()
            .is_some_and(|d| d.reason == DeadlineReason::RetryExecutor)
        {
            h.fire();
        }
    }
    assert!(matches!(
        h.poll().as_slice(),
        [DriverAction::Ledger(WorkerRequest::GiveBack { .. })]
    ));
    h
}

#[test]
fn a_give_back_answered_exhausted_ends_the_delivery_exhausted() {
    let mut h = given_back_after_its_tries();
    h.later(5).reply(Reply::Exhausted(Exhaustion::Deliveries));
    assert!(
        matches!(h.outcome(), Some(Outcome::Exhausted { why: Exhaustion::Deliveries, error }) if error.contains("busy")),
        "{:?}",
        h.outcome()
    );
}

#[test]
fn a_give_back_whose_reply_was_lost_is_verified_by_reading_the_attempt_back() {
    let mut h = given_back_after_its_tries();
    h.later(5).reply_lost();
    h.fire();
    assert!(matches!(
        h.poll().as_slice(),
        [DriverAction::Ledger(WorkerRequest::GiveBack { .. })]
    ));
    h.later(5).refuse();
    assert_eq!(h.poll(), [DriverAction::ReadAttempt]);
    let mut record = claimed(&running(1));
    record.command.status = CommandStatus::Pending;
    record.command.available_at = t(h.now + 700);
    h.later(5).read_back(&record);
    assert!(
        matches!(h.outcome(), Some(Outcome::GaveBack { until, .. }) if *until == t(h.now - 5 + 700)),
        "the first try committed: {:?}",
        h.outcome()
    );
}

#[test]
fn transient_failures_are_counted_per_step() {
    let mut h = Harness::new(&running(2), 0);
    for ordinal in 1..=2 {
        for _ in 1..EXECUTOR_ATTEMPTS_MAX {
            assert_eq!(h.poll(), [execute(ordinal)]);
            h.later(10).executed(ordinal, ExecutorResult::Transient("busy".into()));
            assert_eq!(h.fire().reason, DeadlineReason::RetryExecutor);
        }
        assert_eq!(h.poll(), [execute(ordinal)]);
        h.later(10).executed(ordinal, done(ordinal));
        assert_eq!(h.poll(), [complete(ordinal)]);
        if ordinal == 1 {
            h.later(5).began(2);
        } else {
            h.later(5).finished();
        }
    }
    assert_eq!(h.outcome(), Some(&Outcome::Delivered));
}

#[test]
fn a_ledger_transport_error_retries_the_same_request_after_a_backoff() {
    let mut h = Harness::new(&pending(1), 0);
    assert_eq!(h.poll(), [begin(1)]);
    let mut backoffs = Vec::new();
    for _ in 0..3 {
        h.later(20).ledger_error();
        assert!(!h.driver.awaiting_ledger());
        assert_eq!(h.poll(), [], "nothing is sent before the retry deadline");
        let retry = h.deadline();
        assert_eq!(retry.reason, DeadlineReason::RetryLedger);
        assert!(retry.at > t(h.now));
        backoffs.push(retry.at.as_millis() - h.now);
        h.at(retry.at.as_millis() - 1);
        h.driver.handle_timeout(t(h.now));
        assert_eq!(h.poll(), []);
        h.fire();
        assert_eq!(h.poll(), [begin(1)], "the same request again");
    }
    assert!(
        backoffs.windows(2).all(|w| w[1] == 2 * w[0]),
        "the backoff doubles: {backoffs:?}"
    );
    assert!(backoffs.iter().all(|b| *b <= HEARTBEAT_MS));
    h.later(5).commit();
    assert_eq!(h.poll(), [execute(1)]);
}

#[test]
fn a_heartbeat_lost_in_transport_is_sent_again() {
    let mut h = Harness::new(&running(1), 0);
    assert_eq!(h.poll(), [execute(1)]);
    h.fire();
    assert_eq!(h.poll(), [heartbeat()]);
    h.later(10).ledger_error();
    assert_eq!(h.poll(), []);
    assert_eq!(h.fire().reason, DeadlineReason::RetryLedger);
    assert_eq!(h.poll(), [heartbeat()]);
    let sent = h.now;
    h.later(10).commit();
    assert_eq!(
        h.deadline(),
        Deadline {
            at: t(sent + HEARTBEAT_MS),
            reason: DeadlineReason::Heartbeat
        }
    );
}

#[test]
fn an_unrenewed_lease_is_abandoned_at_its_expiry() {
    let mut h = Harness::new(&running(2), 0);
    assert_eq!(h.poll(), [execute(1)]);
    h.fire();
    assert_eq!(h.poll(), [heartbeat()]);
    // The heartbeat is never answered.
    let expiry = h.deadline();
    assert_eq!(
        expiry,
        Deadline {
            at: t(LEASE_MS as i64),
            reason: DeadlineReason::LeaseExpiry
        }
    );
    h.at(LEASE_MS as i64 - 1);
    h.driver.handle_timeout(t(h.now));
    assert_eq!(h.outcome(), None, "not before the expiry");
    h.fire();
    assert!(matches!(h.outcome(), Some(Outcome::Abandoned(_))), "{:?}", h.outcome());
    h.later(10).executed(1, done(1));
    h.assert_stopped();
}

#[test]
fn a_lease_whose_heartbeats_keep_failing_is_abandoned_at_its_expiry() {
    let mut h = Harness::new(&running(1), 0);
    assert_eq!(h.poll(), [execute(1)]);
    let mut last = h.fire();
    while h.outcome().is_none() {
        for action in h.poll() {
            assert_eq!(action, heartbeat());
            h.later(10).ledger_error();
        }
        last = h.fire();
        assert!(h.now <= LEASE_MS as i64, "still running after the lease lapsed");
    }
    assert_eq!(last.reason, DeadlineReason::LeaseExpiry);
    assert_eq!(h.now, LEASE_MS as i64);
    assert!(matches!(h.outcome(), Some(Outcome::Abandoned(_))));
}

#[test]
fn a_request_that_never_returns_is_abandoned_at_the_lease_expiry() {
    let mut h = Harness::new(&pending(1), 0);
    assert_eq!(h.poll(), [begin(1)]);
    let mut fired = Vec::new();
    while h.outcome().is_none() {
        fired.push(h.fire().reason);
        assert_eq!(h.poll(), []);
    }
    assert_eq!(fired.last(), Some(&DeadlineReason::LeaseExpiry));
    assert_eq!(h.now, LEASE_MS as i64);
}

#[test]
fn a_late_executor_result_for_another_ordinal_is_ignored() {
    let mut h = Harness::new(&running(3), 0);
    assert_eq!(h.run_step(1, done(1)), [complete(1)]);
    // Results for steps 1 and 2 arrive while step 1's completion is in flight.
    h.later(1).executed(1, done(1));
    h.later(1).executed(2, done(2));
    assert_eq!(h.poll(), []);
    h.later(5).began(2);
    assert_eq!(h.poll(), [execute(2)]);
    // ... and for steps 1 and 3 while step 2 runs.
    h.later(1).executed(1, ExecutorResult::Permanent("stale".into()));
    h.later(1).executed(3, done(3));
    assert_eq!(h.poll(), []);
    assert_eq!(h.driver.executing(), Some(2));
    h.later(50).executed(2, done(2));
    assert_eq!(h.poll(), [complete(2)]);
}

// The delivery rules: lost replies, refusals, the ledger's continuation, heartbeats
// beside the executor, and the lease estimate.

#[test]
fn a_completion_whose_reply_was_lost_is_sent_again_and_its_continuation_followed() {
    let mut h = Harness::new(&running(2), 0);
    assert_eq!(h.run_step(1, done(1)), [complete(1)]);
    h.later(5).reply_lost();
    assert_eq!(h.poll(), [], "not before the backoff");
    assert_eq!(h.fire().reason, DeadlineReason::RetryLedger);
    assert_eq!(h.poll(), [complete(1)], "the same completion, same evidence");
    h.later(5).began(2);
    assert_eq!(h.poll(), [execute(2)]);
    assert!(!h.log.contains(&read()), "a repeat that commits needs no read-back");
}

#[test]
fn a_last_completion_whose_reply_was_lost_and_that_the_read_back_shows_applied_is_delivered() {
    let mut h = Harness::new(&running(1), 0);
    assert_eq!(h.run_step(1, done(1)), [complete(1)]);
    h.later(5).reply_lost();
    h.fire();
    assert_eq!(h.poll(), [complete(1)]);
    // The first try finished the attempt and cleared the token: the repeat is refused.
    h.later(5).refuse();
    assert_eq!(
        h.outcome(),
        None,
        "the refused repeat of an uncertain ending write is read back"
    );
    assert_eq!(h.poll(), [read()]);
    assert_eq!(h.poll(), [], "one read at a time");
    h.later(5)
        .read_back(&read_back(CommandStatus::Delivered, common::OWNER_A, 1));
    assert_eq!(h.outcome(), Some(&Outcome::Delivered));
    h.assert_stopped();
}

#[test]
fn a_last_completion_whose_reply_was_lost_and_that_the_read_back_shows_not_applied_is_refused() {
    let others = [
        (CommandStatus::Delivered, common::OWNER_B, 2, "a takeover delivered it"),
        (
            CommandStatus::Delivered,
            common::OWNER_A,
            2,
            "a later delivery by the same name",
        ),
        (CommandStatus::Processing, common::OWNER_B, 2, "a takeover holds it"),
        (CommandStatus::Aborted, common::OWNER_A, 1, "an operator aborted it"),
    ];
    for (status, owner, delivery, why) in others {
        let mut h = Harness::new(&running(1), 0);
        assert_eq!(h.run_step(1, done(1)), [complete(1)]);
        h.later(5).reply_lost();
        h.fire();
        assert_eq!(h.poll(), [complete(1)]);
        h.later(5).refuse();
        assert_eq!(h.poll(), [read()]);
        h.later(5).read_back(&read_back(status, owner, delivery));
        assert_eq!(h.outcome(), Some(&Outcome::Refused(stale())), "{why}");
        h.assert_stopped();
    }
}

#[test]
fn a_fail_whose_reply_was_lost_and_that_the_read_back_shows_applied_ends_failed() {
    let error = "step 1: no such table".to_owned();
    for (status, expected) in [
        (CommandStatus::Failed, Outcome::Failed(error.clone())),
        (CommandStatus::Delivered, Outcome::Refused(stale())),
    ] {
        let mut h = Harness::new(&running(1), 0);
        let fail = h.run_step(1, ExecutorResult::Permanent("no such table".into()));
        assert_eq!(
            fail,
            [DriverAction::Ledger(WorkerRequest::Fail {
                ordinal: Some(1),
                error: error.clone()
            })]
        );
        h.later(5).reply_lost();
        h.fire();
        assert_eq!(h.poll(), fail, "the same fail again");
        h.later(5).refuse();
        assert_eq!(h.poll(), [read()]);
        h.later(5).read_back(&read_back(status, common::OWNER_A, 1));
        assert_eq!(h.outcome(), Some(&expected), "read back {status:?}");
    }
}

#[test]
fn a_finish_whose_reply_was_lost_is_read_back_until_the_read_gets_through() {
    let receipts = [(1, ReceiptStatus::Succeeded), (2, ReceiptStatus::Succeeded)];
    let mut h = Harness::new(&receipts, 0);
    assert_eq!(h.poll(), [finish()]);
    h.later(5).reply_lost();
    h.fire();
    assert_eq!(h.poll(), [finish()]);
    h.later(5).refuse();
    assert_eq!(h.poll(), [read()]);
    h.later(5).ledger_error();
    assert_eq!(h.poll(), [], "not before the backoff");
    assert_eq!(h.fire().reason, DeadlineReason::RetryLedger);
    assert_eq!(h.poll(), [read()]);
    h.later(5).reply_lost();
    h.fire();
    assert_eq!(h.poll(), [read()]);
    h.later(5)
        .read_back(&read_back(CommandStatus::Delivered, common::OWNER_A, 1));
    assert_eq!(h.outcome(), Some(&Outcome::Delivered));
}

#[test]
fn a_refusal_after_no_lost_reply_is_final() {
    // Refused at once.
    let mut h = Harness::new(&running(1), 0);
    assert_eq!(h.run_step(1, done(1)), [complete(1)]);
    h.later(5).refuse();
    assert_eq!(h.outcome(), Some(&Outcome::Refused(stale())));
    // Refused after the ledger was unavailable: that wrote nothing.
    let mut h = Harness::new(&running(1), 0);
    assert_eq!(h.run_step(1, done(1)), [complete(1)]);
    h.later(5).ledger_error();
    h.fire();
    assert_eq!(h.poll(), [complete(1)]);
    h.later(5).refuse();
    assert_eq!(h.outcome(), Some(&Outcome::Refused(stale())));
    assert!(!h.log.contains(&read()));
}

#[test]
fn a_refused_repeat_of_a_lost_begin_is_final() {
    // A begin never ends the attempt: its repeat is refused only if the lease is gone.
    let mut h = Harness::new(&pending(2), 0);
    assert_eq!(h.poll(), [begin(1)]);
    h.later(5).reply_lost();
    h.fire();
    assert_eq!(h.poll(), [begin(1)]);
    h.later(5).refuse();
    assert_eq!(h.outcome(), Some(&Outcome::Refused(stale())));
    assert!(!h.log.contains(&read()));
}

#[test]
fn not_found_is_a_stale_token() {
    let mut h = Harness::new(&pending(1), 0);
    assert_eq!(h.poll(), [begin(1)]);
    h.later(5).fail(Failure::NotFound);
    assert_eq!(h.outcome(), Some(&Outcome::Refused(stale())));

    let mut h = Harness::new(&running(1), 0);
    assert_eq!(h.poll(), [execute(1)]);
    h.fire();
    assert_eq!(h.poll(), [heartbeat()]);
    h.later(5).fail(Failure::NotFound);
    assert_eq!(h.outcome(), Some(&Outcome::Refused(stale())));
    h.later(5).executed(1, done(1));
    h.assert_stopped();
}

#[test]
fn the_ledger_continuation_decides_what_follows() {
    // The ledger began step 3, not the step after the completed one.
    let mut h = Harness::new(&running(3), 0);
    assert_eq!(h.run_step(1, done(1)), [complete(1)]);
    h.later(5).began(3);
    assert_eq!(h.poll(), [execute(3)]);
    // The ledger finished the attempt: it is delivered, whatever steps the claim
    // listed.
    let mut h = Harness::new(&running(3), 0);
    assert_eq!(h.run_step(1, done(1)), [complete(1)]);
    h.later(5).finished();
    assert_eq!(h.outcome(), Some(&Outcome::Delivered));
    assert!(!h.log.contains(&execute(2)));
}

#[test]
fn a_continuation_to_a_step_the_attempt_cannot_take_abandons() {
    for next in [1, 9] {
        let mut h = Harness::new(&running(3), 0);
        assert_eq!(h.run_step(1, done(1)), [complete(1)]);
        h.later(5).began(next);
        match h.outcome() {
            Some(Outcome::Abandoned(reason)) => assert!(reason.contains(&format!("step {next}")), "{reason}"),
            other => panic!("began {next}: expected to abandon, got {other:?}"),
        }
        h.assert_stopped();
    }
}

#[test]
fn a_completion_answered_without_its_continuation_is_an_uncertain_reply() {
    let mut h = Harness::new(&running(2), 0);
    assert_eq!(h.run_step(1, done(1)), [complete(1)]);
    h.later(5).commit();
    assert_eq!(h.poll(), [], "what follows is unknown: nothing is executed");
    assert_eq!(h.fire().reason, DeadlineReason::RetryLedger);
    assert_eq!(h.poll(), [complete(1)]);
    h.later(5).began(2);
    assert_eq!(h.poll(), [execute(2)]);
}

#[test]
fn a_heartbeat_sent_while_the_executor_runs_never_calls_the_executor_again() {
    let mut h = Harness::new(&running(1), 0);
    assert_eq!(h.poll(), [execute(1)]);
    for _ in 0..3 {
        assert_eq!(h.fire().reason, DeadlineReason::Heartbeat);
        assert_eq!(h.poll(), [heartbeat()]);
        h.later(10).commit();
        assert_eq!(h.poll(), [], "a renewal does not restart the step");
        assert_eq!(h.driver.executing(), Some(1));
    }
    h.later(10).executed(1, done(1));
    assert_eq!(h.poll(), [complete(1)]);
    assert_eq!(h.log.iter().filter(|a| **a == execute(1)).count(), 1);
}

#[test]
fn a_heartbeat_falls_due_and_is_sent_while_an_executor_retry_waits() {
    let mut h = Harness::new(&running(1), 0);
    assert_eq!(h.poll(), [execute(1)]);
    h.at(900).executed(1, ExecutorResult::Transient("busy".into()));
    assert_eq!(h.poll(), []);
    assert_eq!(h.fire().reason, DeadlineReason::Heartbeat);
    assert_eq!(h.poll(), [heartbeat()], "the lease is renewed while the retry waits");
    h.later(10).commit();
    assert_eq!(h.fire().reason, DeadlineReason::RetryExecutor);
    assert_eq!(h.poll(), [execute(1)]);
}

#[test]
fn a_driver_that_resumes_past_its_lease_abandons_whatever_it_hears_first() {
    let lapsed = LEASE_MS as i64 + 2_000;
    // The executor's answer first: nothing is written with a lapsed lease.
    let mut h = Harness::new(&running(2), 0);
    assert_eq!(h.poll(), [execute(1)]);
    h.at(lapsed).executed(1, done(1));
    assert_eq!(h.poll(), []);
    assert!(matches!(h.outcome(), Some(Outcome::Abandoned(_))), "{:?}", h.outcome());
    h.assert_stopped();
    // Its timer first.
    let mut h = Harness::new(&running(2), 0);
    assert_eq!(h.poll(), [execute(1)]);
    h.at(lapsed);
    h.driver.handle_timeout(t(h.now));
    assert!(matches!(h.outcome(), Some(Outcome::Abandoned(_))));
    h.executed(1, done(1));
    h.assert_stopped();
    // A late heartbeat commit first: it renewed the lease from when it was sent, and
    // that has lapsed too.
    let mut h = Harness::new(&running(2), 0);
    assert_eq!(h.poll(), [execute(1)]);
    h.fire();
    assert_eq!(h.poll(), [heartbeat()]);
    h.at(HEARTBEAT_MS + LEASE_MS as i64 + 500).commit();
    h.executed(1, done(1));
    assert_eq!(h.poll(), []);
    assert!(matches!(h.outcome(), Some(Outcome::Abandoned(_))));
    assert!(!h.log.contains(&complete(1)));
}

mod scripted_schedules {
    //! The driver against the engine's own transitions as its ledger, under many
    //! deterministic schedules of latencies, transport errors, lost replies (ending
    //! writes' included) and executor results.

    use super::*;
    use crate::common;
    use leasehold_engine::transition;
    use leasehold_engine::{decide, AttemptStatus, Refusal as EngineRefusal, Request};

    /// A small deterministic generator (xorshift64*), so every schedule comes from
    /// its seed.
    struct Seeded(u64);

    impl Seeded {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    /// What becomes of a ledger call.
    enum Fate {
        Committed,
        /// Lost before the ledger applied it: unavailable, or (the connection died
        /// while it was sent) ambiguous.
        RequestLost(Failure),
        /// Applied, but the reply was lost.
        ReplyLost,
    }

    /// Applies a request to the record as a ledger does; answers the ledger's reply.
    fn apply(record: &mut AttemptRecord, request: &WorkerRequest, now: Timestamp) -> Result<Reply, EngineRefusal> {
        let plan = common::resume_plan();
        let (writes, reply) = decide(record, Request::Worker(request, &common::token_a(), Some(&plan)), now)?;
        assert!(writes.guard.admits(Some(&record.command)));
        writes.apply_to(record);
        Ok(reply)
    }

    /// Performs the ledger call `request` (`None`: the read-back) as `fate` says and
    /// reports how it ended to `driver`; answers whether it ended the attempt with
    /// its reply lost.
    fn perform(
        driver: &mut Driver,
        record: &mut AttemptRecord,
        request: Option<WorkerRequest>,
        fate: Fate,
        now: Timestamp,
    ) -> bool {
        match (fate, request) {
            (Fate::RequestLost(failure), _) => driver.handle_failure(now, failure),
            (Fate::Committed, None) => driver.handle_read(now, record),
            (Fate::Committed, Some(request)) => match apply(record, &request, now) {
                Ok(reply) => driver.handle_reply(now, reply),
                Err(refusal) => driver.handle_failure(now, Failure::Refused(refusal)),
            },
            (Fate::ReplyLost, request) => {
                let open = !record.attempt.status.is_terminal();
                let applied = request.is_some_and(|request| apply(record, &request, now).is_ok());
                driver.handle_failure(now, Failure::Ambiguous);
                return applied && open && record.attempt.status.is_terminal();
            }
        }
        false
    }

    /// Runs one schedule; answers how it ended.
    fn run(seed: u64) -> &'static str {
        let mut rng = Seeded(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let plan = common::resume_plan();
        let mut now = common::CLAIMED_MS;
        let enqueued = common::enqueued(&plan);
        // Every third seed's claim began nothing (a ledger without a fused claim).
        let mut record = if seed.is_multiple_of(3) {
            common::claimed_by(&enqueued, &plan, common::OWNER_A, common::token_a(), now)
        } else {
            let writes = transition::claim_and_begin(
                &enqueued,
                plan.recovery,
                common::OWNER_A,
                common::token_a(),
                LEASE_MS,
                t(now),
            )
            .expect("a fresh command is claimable");
            common::applied(&enqueued, &writes)
        };
        // The claim granted the common lease; grant this file's shorter one.
        record.command.lease_until = Some(t(now + LEASE_MS as i64));
        let mut driver = Driver::fused(&record, LEASE_MS, t(now));
        let mut ledger: Option<(Option<WorkerRequest>, i64, Fate)> = None;
        let mut executor: Option<(u32, i64, ExecutorResult)> = None;
        // Whether a write that ended the attempt committed with its reply lost.
        let mut ended_unseen = false;
        let horizon = now + 120_000;

        while driver.outcome().is_none() && now < horizon {
            while let Some(action) = driver.poll_action(t(now)) {
                match action {
                    DriverAction::Execute { ordinal } => {
                        assert!(executor.is_none(), "seed {seed}: two executor calls at once");
                        let latency = if rng.below(50) == 0 {
                            3_000 + rng.below(4_000)
                        } else {
                            1 + rng.below(900)
                        };
                        let result = match rng.below(40) {
                            0 => ExecutorResult::Permanent("refused by target".into()),
                            1..=5 => ExecutorResult::Transient("timeout".into()),
                            _ => ExecutorResult::Done {
                                evidence: evidence(ordinal),
                                target_receipt: target_receipt(ordinal),
                            },
                        };
                        executor = Some((ordinal, now + latency as i64, result));
                    }
                    call => {
                        let request = match call {
                            DriverAction::Ledger(request) => Some(request),
                            _ => None,
                        };
                        assert!(ledger.is_none(), "seed {seed}: two ledger requests in flight");
                        let fate = match rng.below(20) {
                            0 => Fate::RequestLost(Failure::Unavailable),
                            1 => Fate::RequestLost(Failure::Ambiguous),
                            2 | 3 => Fate::ReplyLost,
                            _ => Fate::Committed,
                        };
                        let latency = if rng.below(30) == 0 {
                            1_500 + rng.below(2_000)
                        } else {
                            1 + rng.below(80)
                        };
                        ledger = Some((request, now + latency as i64, fate));
                    }
                }
            }
            if driver.outcome().is_some() {
                break;
            }
            let deadline = driver
                .poll_timeout()
                .unwrap_or_else(|| panic!("seed {seed}: a running driver has no deadline"));
            let next_ledger = ledger.as_ref().map_or(i64::MAX, |l| l.1);
            let next_executor = executor.as_ref().map_or(i64::MAX, |e| e.1);
            let next_timer = deadline.at.as_millis().max(now);
            let next = next_ledger.min(next_executor).min(next_timer);
            assert!(next >= now);
            now = next;
            if next_ledger == next {
                let (request, _, fate) = ledger.take().expect("a ledger request is in flight");
                ended_unseen |= perform(&mut driver, &mut record, request, fate, t(now));
            } else if next_executor == next {
                let (ordinal, _, result) = executor.take().expect("an executor call is running");
                driver.handle_executed(t(now), ordinal, result);
            } else {
                driver.handle_timeout(t(now));
            }
            if driver.outcome().is_none() && !record.attempt.status.is_terminal() {
                // While the driver works, the ledger agrees that its lease is live.
                assert_eq!(record.command.status, CommandStatus::Processing, "seed {seed}");
                let until = record.command.lease_until.expect("a held lease has a deadline");
                assert!(
                    until >= t(now),
                    "seed {seed}: the driver still works at {now} but the lease lapsed at {until:?}"
                );
            }
        }

        assert_eq!(driver.poll_action(t(now)), None, "seed {seed}");
        let ended = match driver.outcome() {
            Some(Outcome::Delivered) => {
                assert_eq!(record.attempt.status, AttemptStatus::Succeeded, "seed {seed}");
                assert_eq!(record.command.status, CommandStatus::Delivered, "seed {seed}");
                for r in &record.receipts {
                    let expected = leasehold_engine::canonical::canonical_json(&evidence(r.ordinal));
                    assert_eq!(r.evidence.as_deref(), Some(expected.as_str()), "seed {seed}");
                }
                "delivered"
            }
            Some(Outcome::Failed(_)) => {
                assert_eq!(record.attempt.status, AttemptStatus::Failed, "seed {seed}");
                assert_eq!(record.command.status, CommandStatus::Failed, "seed {seed}");
                "failed"
            }
            Some(Outcome::GaveBack { .. }) => {
                assert_eq!(record.command.status, CommandStatus::Pending, "seed {seed}");
                assert_eq!(record.attempt.status, AttemptStatus::Queued, "seed {seed}");
                "gave back"
            }
            Some(Outcome::Exhausted { .. }) => panic!("seed {seed}: the first delivery is never exhausted"),
            Some(Outcome::Abandoned(_)) if ended_unseen => {
                // The lease estimate lapsed before a lost reply was disambiguated.
                assert!(record.attempt.status.is_terminal(), "seed {seed}");
                "abandoned"
            }
            Some(Outcome::Abandoned(_)) => {
                assert_eq!(record.command.status, CommandStatus::Processing, "seed {seed}");
                assert!(!record.attempt.status.is_terminal(), "seed {seed}");
                "abandoned"
            }
            Some(Outcome::Refused(r)) => panic!("seed {seed}: the sole lease holder was refused: {r}"),
            Some(Outcome::Yielded { .. }) => panic!("seed {seed}: no target is limited, yet the lease yielded"),
            None => {
                assert!(now >= horizon, "seed {seed}: stopped without an outcome");
                "still running"
            }
        };
        if ended_unseen && ended != "abandoned" {
            // A lost reply to the ending write was disambiguated by a read-back.
            return "delivered or failed after a lost reply";
        }
        ended
    }

    #[test]
    fn the_driver_keeps_its_lease_live_and_ends_consistently_under_scripted_schedules() {
        let mut ends = std::collections::BTreeMap::new();
        for seed in 0..400 {
            *ends.entry(run(seed)).or_insert(0u32) += 1;
        }
        // The schedules must reach every ending, or they test less than they claim.
        for ending in [
            "delivered",
            "failed",
            "gave back",
            "abandoned",
            "delivered or failed after a lost reply",
        ] {
            assert!(
                ends.get(ending).is_some_and(|n| *n > 0),
                "no schedule ended {ending}: {ends:?}"
            );
        }
    }
}

#[test]
fn a_repeated_write_that_commits_settles_the_uncertainty_so_a_later_refusal_needs_no_read_back() {
    let mut h = Harness::new(&pending(1), 0);
    assert_eq!(h.poll(), [begin(1)]);
    h.at(5).reply_lost();
    h.fire();
    assert_eq!(h.poll(), [begin(1)], "the same begin again");
    h.later(5).commit();
    assert_eq!(h.run_step(1, done(1)), [complete(1)]);
    // The repeat committed, so nothing is in doubt: a refusal now means the lease was
    // taken over, and the driver stops at once instead of reading the attempt back.
    h.later(5).refuse();
    assert_eq!(h.outcome(), Some(&Outcome::Refused(stale())));
    assert!(!h.log.contains(&read()));
    h.assert_stopped();
}

/// The writes that end an attempt (the ones a worker claims its next command with):
/// a finish, a fail, the last step's completion; no begin, earlier completion,
/// heartbeat or read.
#[test]
fn only_a_finish_a_fail_or_the_last_completion_ends_the_attempt() {
    let driver = Driver::fused(&claimed(&running(3)), LEASE_MS, t(0));
    let complete = |ordinal| WorkerRequest::CompleteAndContinue {
        ordinal,
        evidence: evidence(ordinal),
        target_receipt: target_receipt(ordinal),
        lease_ms: LEASE_MS,
    };
    let fail = WorkerRequest::Fail {
        ordinal: Some(1),
        error: "no".into(),
    };
    for (request, ends) in [
        (WorkerRequest::Finish, true),
        (fail, true),
        (complete(3), true),
        (complete(2), false),
        (complete(1), false),
        (
            WorkerRequest::BeginStep {
                ordinal: 3,
                lease_ms: LEASE_MS,
            },
            false,
        ),
        (WorkerRequest::Heartbeat { lease_ms: LEASE_MS }, false),
    ] {
        assert_eq!(driver.ends_attempt(&request), ends, "{request:?}");
    }
}

/// Evidence whose canonical JSON, with an empty target receipt (`{}`), takes
/// exactly `bytes` bytes.
fn evidence_of(bytes: usize) -> ExecutorResult {
    let overhead = r#"{"blob":""}"#.len() + "{}".len();
    ExecutorResult::Done {
        evidence: json!({"blob": "x".repeat(bytes - overhead)}),
        target_receipt: json!({}),
    }
}

fn over_the_cap(ordinal: u32, bytes: &str, limit: &str) -> String {
    format!(
        "step {ordinal}: step step-{ordinal}: evidence (with its target receipt) is {bytes} bytes, over the limit of \
         {limit} bytes (the worker's --max-evidence-bytes)"
    )
}

#[test]
fn evidence_over_the_default_cap_fails_the_step_naming_its_size_and_the_limit() {
    let mut h = Harness::new(&running(2), 0);
    let next = h.run_step(1, evidence_of(6_260_112));
    let error = over_the_cap(1, "6,260,112", "262,144");
    assert_eq!(
        next,
        [DriverAction::Ledger(WorkerRequest::Fail {
            ordinal: Some(1),
            error: error.clone()
        })],
        "nothing of the evidence is written"
    );
    h.later(5).commit();
    assert_eq!(h.outcome(), Some(&Outcome::Failed(error)));
    h.assert_stopped();
    assert!(!h
        .log
        .iter()
        .any(|a| matches!(a, DriverAction::Ledger(WorkerRequest::CompleteAndContinue { .. }))));
    assert!(!h.log.contains(&execute(2)));
}

#[test]
fn evidence_at_the_cap_is_stored_and_one_byte_more_is_not() {
    let mut h = Harness::new(&running(2), 0);
    let at_cap = evidence_of(MAX_EVIDENCE_BYTES);
    let next = h.run_step(1, at_cap.clone());
    let ExecutorResult::Done {
        evidence,
        target_receipt,
    } = at_cap
    else {
        unreachable!()
    };
    assert_eq!(
        next,
        [DriverAction::Ledger(WorkerRequest::CompleteAndContinue {
            ordinal: 1,
            evidence,
            target_receipt,
            lease_ms: LEASE_MS,
        })]
    );
    h.later(5).began(2);
    let next = h.run_step(2, evidence_of(MAX_EVIDENCE_BYTES + 1));
    assert_eq!(
        next,
        [DriverAction::Ledger(WorkerRequest::Fail {
            ordinal: Some(2),
            error: over_the_cap(2, "262,145", "262,144"),
        })]
    );
}

#[test]
fn the_evidence_cap_is_configurable_and_counts_the_target_receipt() {
    let mut h = Harness::with_evidence_cap(&running(1), 2_000);
    let receipt_heavy = ExecutorResult::Done {
        evidence: json!({}),
        target_receipt: json!({"id": "r".repeat(2_000)}),
    };
    let next = h.run_step(1, receipt_heavy);
    assert_eq!(
        next,
        [DriverAction::Ledger(WorkerRequest::Fail {
            ordinal: Some(1),
            error: over_the_cap(1, "2,011", "2,000"),
        })]
    );
    let mut h = Harness::with_evidence_cap(&running(1), 8 * 1024 * 1024);
    let next = h.run_step(1, evidence_of(6_260_112));
    assert!(
        matches!(
            next.as_slice(),
            [DriverAction::Ledger(WorkerRequest::CompleteAndContinue {
                ordinal: 1,
                ..
            })]
        ),
        "a larger cap admits it: {next:?}"
    );
}
