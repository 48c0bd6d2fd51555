//! The ledger conformance suite: one set of tests that every [`Ledger`] backend must
//! pass, written against the trait only.
//!
//! A backend instantiates it with [`conformance_suite!`], naming an async factory
//! `fn(Arc<ManualClock>) -> Option<Harness<L>>` that answers a fresh, migrated ledger whose
//! lease decisions use that clock, plus a way to open another handle to the same
//! ledger (the race tests give every claimer its own handle). Time moves only when a
//! test advances the [`ManualClock`]; nothing here sleeps.

use leasehold::clock::{Clock, ManualClock};
use leasehold::engine::canonical::{canonical_json, sha256_hex};
use leasehold::engine::plan::{idempotency_key, PlanError};
use leasehold::engine::transition::{Continued, ReconcileOutcome};
use leasehold::engine::{
    Action, AttemptId, AttemptRecord, AttemptStatus, ClaimRequest, CommandId, CommandStatus, Lease, LeaseToken, PlanId,
    PlanSpec, PlanStatus, ReceiptStatus, Refusal, Reply, Step, Timestamp, WorkerRequest,
};
use leasehold::ledger::{Claimed, Ledger, LedgerError};
use serde_json::{json, Value};
use std::any::Any;
use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

mod keys;
mod limits;
mod policy;
mod retention;
mod routing;
mod templates;
mod traces;
pub use keys::*;
pub use limits::*;
pub use policy::*;
pub use retention::*;
pub use routing::*;
pub use templates::*;
pub use traces::*;

/// Where every test's ledger clock starts (2023-11-14T22:13:20Z).
pub const START: Timestamp = Timestamp::from_millis(1_700_000_000_000);
/// The lease the suite's workers ask for.
pub const LEASE_MS: u64 = 30_000;
/// The executors the suite's plans may name.
pub const KNOWN: &[&str] = &["dry-run:v1"];

type OpenHandle<L> = Box<dyn Fn() -> Pin<Box<dyn Future<Output = L> + Send>> + Send + Sync>;

/// A fresh ledger for one test, its clock, and a way to open more handles to it.
pub struct Harness<L> {
    /// The ledger under test.
    pub ledger: L,
    /// The clock the ledger decides leases on.
    pub clock: Arc<ManualClock>,
    open: OpenHandle<L>,
    _keep: Box<dyn Any + Send + Sync>,
}

impl<L: Ledger> Harness<L> {
    /// A harness over `ledger`; `open` answers another handle to the same ledger and
    /// `keep` is held until the test ends (a temporary directory, say).
    pub fn new<F, Fut>(ledger: L, clock: Arc<ManualClock>, open: F, keep: impl Any + Send + Sync) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = L> + Send + 'static,
    {
        let open: OpenHandle<L> = Box::new(move || Box::pin(open()));
        Self {
            ledger,
            clock,
            open,
            _keep: Box::new(keep),
        }
    }

    /// Another handle to the same ledger (another connection).
    pub async fn open_handle(&self) -> L {
        (self.open)().await
    }

    /// The ledger clock's now.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Moves the ledger clock forward.
    pub fn advance_ms(&self, ms: u64) {
        self.clock.advance_ms(ms);
    }
}

/// Expands to one `#[tokio::test]` per conformance test, each on a fresh ledger from
/// `$factory` (an async `fn(Arc<ManualClock>) -> Option<Harness<L>>`; `None` skips the
/// test, for a backend whose server is not configured — the factory says why).
#[macro_export]
macro_rules! conformance_suite {
    ($factory:expr) => {
        $crate::conformance_suite!(@current_thread $factory;
            register_plan_validation_error_names_the_field_and_writes_nothing,
            registering_the_same_content_twice_answers_the_same_plan,
            list_plans_answers_every_plan_oldest_first,
            enqueue_writes_a_queued_attempt_pending_receipts_in_step_order_and_a_pending_command,
            enqueue_guards_refuse_and_write_nothing,
            retry_after_failure_and_compensate_after_success_are_accepted,
            claim_makes_the_command_processing_and_the_attempt_running_and_leaves_nothing_claimable,
            claim_answers_at_most_the_batch,
            heartbeat_renews_the_lease_on_the_ledger_clock,
            step_writes_renew_the_lease_on_the_ledger_clock,
            begin_complete_finish_delivers_with_canonical_evidence_and_its_sha256,
            begin_step_out_of_order_is_refused_and_changes_nothing,
            retried_begin_and_complete_are_idempotent,
            fail_aborts_later_receipts_and_fails_the_attempt_and_command,
            worker_transitions_with_a_stale_token_are_refused_and_change_nothing,
            worker_transitions_on_an_unclaimed_command_are_refused,
            a_live_lease_is_never_taken_over,
            after_expiry_another_owner_takes_over_and_the_old_holder_is_fenced,
            resume_takeover_keeps_succeeded_receipts_and_resets_the_running_one_with_the_same_key,
            replay_takeover_resets_every_receipt_and_drops_evidence,
            reconcile_leaves_a_pending_command_unchanged,
            reconcile_refuses_a_live_lease,
            reconcile_requeues_an_expired_lease_and_fences_its_holder,
            reconcile_leaves_a_terminal_attempt_unchanged,
            abort_fences_the_active_worker,
            abort_of_a_queued_attempt_makes_it_unclaimable,
            abort_of_a_terminal_attempt_is_refused,
            unknown_plan_and_attempt_ids_are_not_found,
            open_attempts_counts_queued_and_running,
            history_is_ordered_by_number,
            retire_plan_makes_enqueue_refuse,
            plans_are_found_by_exact_name_newest_ready_first,
            plans_page_newest_first_in_registration_order,
            every_handle_sees_every_committed_write,
            claim_and_begin_begins_each_claimed_attempts_next_step,
            complete_and_continue_delivers_n_steps_in_n_plus_one_transitions,
            fused_writes_with_a_stale_token_are_refused_and_change_nothing,
            the_write_that_ends_an_attempt_claims_the_next_and_a_refused_one_claims_nothing,
            a_plans_delivery_policy_is_stored_and_read_back,
            a_give_back_requeues_after_its_delay_on_the_ledger_clock_and_keeps_the_error,
            the_delivery_cap_ends_an_attempt_exhausted_at_a_give_back_and_at_a_claim,
            the_deadline_ends_an_attempt_exhausted_at_a_claim,
            a_scheduled_enqueue_is_claimable_from_its_start_and_never_before,
            bulk_recovery_retries_and_aborts_through_the_ledgers_transitions,
            claims_take_only_the_routes_the_worker_can_run,
            a_claim_finds_a_runnable_command_behind_many_it_cannot_run,
            the_command_follows_its_next_step_and_only_a_capable_worker_takes_it_over,
            the_fleet_says_what_a_queued_attempt_waits_for,
            a_bad_limit_is_refused_naming_the_field_and_a_new_target_is_created_on_first_use,
            live_leases_on_a_target_never_pass_its_limit_and_an_ended_lease_frees_a_slot,
            a_full_targets_backlog_hides_no_other_work,
            entries_never_pass_the_rate_in_any_window,
            a_lease_moved_onto_a_full_target_is_handed_back_without_spending_a_delivery,
            the_breaker_opens_after_consecutive_give_backs_lets_one_probe_and_closes_on_success,
            an_expired_lease_is_not_renewed_onto_a_full_target,
            retention_keeps_open_baseline_and_latest_successful_attempts_and_prunes_the_rest_in_batches,
            retention_respects_the_cutoff_and_the_states_and_a_dry_run_deletes_nothing,
            retention_keeps_a_compensation_and_the_guards_decide_as_before,
            an_attempt_keeps_the_trace_it_was_enqueued_in_through_every_read,
            an_attempt_enqueued_without_a_trace_starts_its_own,
            an_enqueue_key_answers_the_first_attempt_and_refuses_another_request,
            a_key_that_is_not_one_is_refused_as_bad_input,
            a_template_freezes_each_inputs_payloads_on_its_receipts_and_runs_them_side_by_side,
            bad_input_is_refused_naming_the_field_and_writes_nothing,
            an_order_key_runs_one_attempt_at_a_time_in_enqueue_order,
            a_failed_head_blocks_its_key_or_lets_the_next_run_as_the_plan_says,
            aborting_a_waiting_attempt_skips_it_and_the_order_goes_on,
            an_enqueue_key_covers_the_input_and_the_order_key,
            retention_keeps_a_templates_baseline_of_the_latest_input,
        );
        $crate::conformance_suite!(@multi_thread $factory;
            race_eight_claimers_claim_each_of_1000_commands_exactly_once,
            race_stale_holder_writes_are_refused_while_the_new_holder_proceeds,
            race_concurrent_claimers_never_hold_more_leases_on_a_target_than_its_limit,
        );
    };
    (@current_thread $factory:expr; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                let clock = ::std::sync::Arc::new(::leasehold::clock::ManualClock::new($crate::conformance::START));
                if let Some(harness) = ($factory)(clock).await {
                    $crate::conformance::$name(harness).await;
                }
            }
        )+
    };
    (@multi_thread $factory:expr; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let clock = ::std::sync::Arc::new(::leasehold::clock::ManualClock::new($crate::conformance::START));
                if let Some(harness) = ($factory)(clock).await {
                    $crate::conformance::$name(harness).await;
                }
            }
        )+
    };
}

// ---------------------------------------------------------------------------------
// Helpers

/// A plan of `steps` dry-run steps named `step-1`, `step-2`, …
pub fn spec(name: &str, recovery: &str, steps: usize) -> PlanSpec {
    PlanSpec {
        input: None,
        on_failure: None,
        name: name.to_owned(),
        queue: None,
        recovery: recovery.to_owned(),
        volatile_fields: Vec::new(),
        steps: (1..=steps)
            .map(|i| Step {
                code: format!("step-{i}"),
                executor: "dry-run:v1".to_owned(),
                target: None,
                payload: json!({"n": i}),
                retry: None,
            })
            .collect(),
        retry: None,
    }
}

pub(crate) async fn register<L: Ledger>(l: &L, name: &str, recovery: &str, steps: usize) -> PlanId {
    l.register_plan(spec(name, recovery, steps), KNOWN)
        .await
        .expect("register plan")
        .id
}

/// The evidence a worker reports for a step.
fn evidence(owner: &str, ordinal: u32) -> Value {
    json!({"worker": owner, "step": ordinal, "rows": [3, 1, 2]})
}

fn target(ordinal: u32) -> Value {
    json!({"target_ref": format!("t-{ordinal}")})
}

/// Claims and expects exactly one command.
pub(crate) async fn claim_one<L: Ledger>(l: &L, owner: &str) -> Claimed {
    let mut claimed = l.claim(owner, 10, LEASE_MS).await.expect("claim");
    assert_eq!(
        claimed.len(),
        1,
        "expected exactly one claimable command, got {}",
        claimed.len()
    );
    claimed.remove(0)
}

pub(crate) async fn assert_nothing_claimable<L: Ledger>(l: &L) {
    let claimed = l.claim("nobody", 10, LEASE_MS).await.expect("claim");
    assert!(
        claimed.is_empty(),
        "expected nothing claimable, got {} command(s)",
        claimed.len()
    );
}

async fn run_step<L: Ledger>(l: &L, lease: &Lease, owner: &str, ordinal: u32) {
    l.begin_step(lease, ordinal, LEASE_MS).await.expect("begin step");
    l.complete_step(lease, ordinal, &evidence(owner, ordinal), &target(ordinal), LEASE_MS)
        .await
        .expect("complete step");
}

/// Claims the only claimable command and delivers every step.
pub(crate) async fn deliver<L: Ledger>(l: &L, owner: &str) -> Claimed {
    let c = claim_one(l, owner).await;
    finish_all(l, &c, owner).await;
    c
}

/// Delivers every step of a claimed command and finishes it.
pub(crate) async fn finish_all<L: Ledger>(l: &L, c: &Claimed, owner: &str) {
    for r in &c.record.receipts {
        run_step(l, &c.lease, owner, r.ordinal).await;
    }
    l.finish(&c.lease).await.expect("finish");
}

/// Claims the only claimable command, delivers the steps before `ordinal`, begins it
/// and fails there.
pub(crate) async fn fail_at<L: Ledger>(l: &L, owner: &str, ordinal: u32) -> Claimed {
    let c = claim_one(l, owner).await;
    for o in 1..ordinal {
        run_step(l, &c.lease, owner, o).await;
    }
    l.begin_step(&c.lease, ordinal, LEASE_MS).await.expect("begin step");
    l.fail(&c.lease, Some(ordinal), "target said no").await.expect("fail");
    c
}

pub(crate) async fn record<L: Ledger>(l: &L, attempt: &AttemptId) -> AttemptRecord {
    l.attempt(attempt).await.expect("attempt")
}

#[track_caller]
pub(crate) fn assert_stale<T: std::fmt::Debug>(result: Result<T, LedgerError>, command: &CommandId, what: &str) {
    match result {
        Err(LedgerError::Refused(Refusal::StaleToken { command: c })) => {
            assert_eq!(&c, command, "{what}: refusal names the wrong command")
        }
        other => panic!("{what}: expected Refused(StaleToken {{ command: {command} }}), got {other:?}"),
    }
}

/// Tries every worker write under `lease` and expects each to be refused as stale.
async fn assert_every_write_is_stale<L: Ledger>(l: &L, lease: &Lease, ordinal: u32) {
    let c = &lease.command_id;
    assert_stale(l.heartbeat(lease, LEASE_MS).await, c, "heartbeat");
    assert_stale(l.begin_step(lease, ordinal, LEASE_MS).await, c, "begin_step");
    assert_stale(
        l.complete_step(lease, ordinal, &evidence("stale", ordinal), &target(ordinal), LEASE_MS)
            .await,
        c,
        "complete_step",
    );
    assert_stale(l.fail(lease, Some(ordinal), "stale failure").await, c, "fail");
    assert_stale(l.fail(lease, None, "stale failure").await, c, "fail without a step");
    assert_stale(l.finish(lease).await, c, "finish");
}

#[track_caller]
fn assert_guard_refusal<T: std::fmt::Debug>(result: Result<T, LedgerError>, action: Action, what: &str) {
    match result {
        Err(LedgerError::Refused(Refusal::Guard { action: a, .. })) => assert_eq!(a, action, "{what}"),
        other => panic!("{what}: expected Refused(Guard {{ action: {action} }}), got {other:?}"),
    }
}

#[track_caller]
fn assert_not_found<T: std::fmt::Debug>(result: Result<T, LedgerError>, kind: &str, id: &str, what: &str) {
    match result {
        Err(LedgerError::NotFound { kind: k, id: i }) => {
            assert_eq!((k, i.as_str()), (kind, id), "{what}");
        }
        other => panic!("{what}: expected NotFound {{ kind: {kind}, id: {id} }}, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------
// Plans

/// An invalid plan is refused with an error naming the field, and nothing is stored.
pub async fn register_plan_validation_error_names_the_field_and_writes_nothing<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let mut unknown = spec("bad-executor", "resume", 2);
    unknown.steps[1].executor = "nope:v9".into();
    let err = l.register_plan(unknown, KNOWN).await.unwrap_err();
    assert!(
        matches!(&err, LedgerError::InvalidPlan(PlanError::UnknownExecutor { index: 1, executor, .. }) if executor == "nope:v9"),
        "{err:?}"
    );
    assert!(err.to_string().contains("steps[1].executor"), "{err}");

    let empty = spec("no-steps", "resume", 0);
    let err = l.register_plan(empty, KNOWN).await.unwrap_err();
    assert_eq!(err, LedgerError::InvalidPlan(PlanError::NoSteps));
    assert!(err.to_string().contains("steps"), "{err}");

    let mut duplicate = spec("dup", "resume", 2);
    duplicate.steps[1].code = "step-1".into();
    let err = l.register_plan(duplicate, KNOWN).await.unwrap_err();
    assert!(
        matches!(
            &err,
            LedgerError::InvalidPlan(PlanError::DuplicateCode { index: 1, .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("steps[1].code"), "{err}");

    let err = l.register_plan(spec("rewind", "rewind", 1), KNOWN).await.unwrap_err();
    assert!(
        matches!(&err, LedgerError::InvalidPlan(PlanError::BadRecovery(_))),
        "{err:?}"
    );
    assert!(err.to_string().starts_with("invalid plan: recovery:"), "{err}");

    assert_eq!(
        l.list_plans().await.unwrap(),
        Vec::new(),
        "an invalid plan wrote something"
    );
    assert_eq!(l.open_attempts().await.unwrap(), 0);
}

/// Registering the same content twice answers the first plan; other content answers
/// a new one.
pub async fn registering_the_same_content_twice_answers_the_same_plan<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let first = l.register_plan(spec("same", "resume", 3), KNOWN).await.unwrap();
    assert_eq!(first.status, PlanStatus::Ready);
    assert_eq!(first.name, "same");
    assert_eq!(first.steps.len(), 3);
    assert_eq!(first.created_at, START);
    assert_eq!(first.fingerprint.len(), 64);
    h.advance_ms(1_000);
    let second = l.register_plan(spec("same", "resume", 3), KNOWN).await.unwrap();
    assert_eq!(second, first, "the same content must answer the same plan");
    assert_eq!(l.plan(&first.id).await.unwrap(), first);
    assert_eq!(l.list_plans().await.unwrap(), vec![first.clone()]);

    let other = l.register_plan(spec("same", "replay", 3), KNOWN).await.unwrap();
    assert_ne!(other.id, first.id);
    assert_ne!(other.fingerprint, first.fingerprint);
    assert_eq!(l.list_plans().await.unwrap().len(), 2);
}

/// `list_plans` answers every plan, oldest first.
pub async fn list_plans_answers_every_plan_oldest_first<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let mut ids = Vec::new();
    for name in ["c", "a", "b"] {
        ids.push(register(l, name, "resume", 1).await);
        h.advance_ms(10);
    }
    let listed: Vec<PlanId> = l.list_plans().await.unwrap().into_iter().map(|p| p.id).collect();
    assert_eq!(listed, ids);
}

// ---------------------------------------------------------------------------------
// Enqueue

/// Enqueue writes the attempt QUEUED, a PENDING receipt per step in order, and a
/// PENDING command available now.
pub async fn enqueue_writes_a_queued_attempt_pending_receipts_in_step_order_and_a_pending_command<L: Ledger>(
    h: Harness<L>,
) {
    let l = &h.ledger;
    let plan = register(l, "six", "resume", 6).await;
    h.advance_ms(500);
    let now = h.now();
    let rec = l.enqueue(&plan, Action::Execute).await.unwrap();

    let a = &rec.attempt;
    assert_eq!(a.plan_id, plan);
    assert_eq!(a.number, 1);
    assert_eq!(a.action, Action::Execute);
    assert_eq!(a.status, AttemptStatus::Queued);
    assert_eq!(a.created_at, now);
    assert_eq!((a.started_at, a.finished_at, a.error.as_deref()), (None, None, None));

    assert_eq!(rec.receipts.len(), 6);
    for (i, r) in rec.receipts.iter().enumerate() {
        let ordinal = u32::try_from(i).unwrap() + 1;
        let code = format!("step-{ordinal}");
        assert_eq!(r.attempt_id, a.id);
        assert_eq!(r.ordinal, ordinal);
        assert_eq!(r.step_code, code);
        assert_eq!(r.idempotency_key, idempotency_key(&a.id, ordinal, &code));
        assert_eq!(r.status, ReceiptStatus::Pending);
        assert_eq!(
            (&r.evidence, &r.evidence_sha256, &r.target_receipt, &r.error),
            (&None, &None, &None, &None)
        );
        assert_eq!((r.started_at, r.finished_at), (None, None));
    }

    let c = &rec.command;
    assert_eq!(c.attempt_id, a.id);
    assert_eq!(c.status, CommandStatus::Pending);
    assert_eq!(c.available_at, now);
    assert_eq!(
        (c.lease_owner.as_deref(), c.lease_token.as_ref(), c.lease_until),
        (None, None, None)
    );
    assert_eq!(c.last_heartbeat_at, None);
    assert_eq!(c.delivery_count, 0);
    assert_eq!((c.last_error.as_deref(), c.finished_at), (None, None));

    assert_eq!(
        record(l, &a.id).await,
        rec,
        "the stored record differs from the answered one"
    );
    assert_eq!(l.history(&plan).await.unwrap(), vec![rec]);
    assert_eq!(l.open_attempts().await.unwrap(), 1);
}

/// Each action guard refuses with a typed error and writes nothing.
pub async fn enqueue_guards_refuse_and_write_nothing<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;

    // A plan with no attempts: retry and compensate have nothing to work on.
    let fresh = register(l, "fresh", "resume", 2).await;
    assert_guard_refusal(
        l.enqueue(&fresh, Action::Retry).await,
        Action::Retry,
        "retry with no attempt",
    );
    assert_guard_refusal(
        l.enqueue(&fresh, Action::Compensate).await,
        Action::Compensate,
        "compensate with no attempt",
    );
    assert_eq!(l.history(&fresh).await.unwrap(), Vec::new());

    // An open attempt: nothing else may be enqueued.
    let open = register(l, "open", "resume", 2).await;
    let first = l.enqueue(&open, Action::Execute).await.unwrap();
    let before = l.history(&open).await.unwrap();
    for action in [Action::Execute, Action::Retry, Action::Compensate] {
        assert_guard_refusal(l.enqueue(&open, action).await, action, "enqueue with an open attempt");
    }
    let c = claim_one(l, "w").await;
    assert_eq!(c.lease.attempt_id, first.attempt.id);
    let before_running = l.history(&open).await.unwrap();
    assert_eq!(before_running.len(), before.len());
    assert_guard_refusal(
        l.enqueue(&open, Action::Execute).await,
        Action::Execute,
        "execute with a RUNNING attempt",
    );
    assert_eq!(
        l.history(&open).await.unwrap(),
        before_running,
        "a refused enqueue changed the history"
    );

    // A SUCCEEDED latest attempt: no retry.
    run_step(l, &c.lease, "w", 1).await;
    run_step(l, &c.lease, "w", 2).await;
    l.finish(&c.lease).await.unwrap();
    let done = l.history(&open).await.unwrap();
    assert_guard_refusal(
        l.enqueue(&open, Action::Retry).await,
        Action::Retry,
        "retry after success",
    );
    assert_eq!(l.history(&open).await.unwrap(), done);

    // A forward attempt that failed at its first step has no succeeded step.
    let failed = register(l, "failed-first", "resume", 2).await;
    l.enqueue(&failed, Action::Execute).await.unwrap();
    fail_at(l, "w", 1).await;
    let failed_history = l.history(&failed).await.unwrap();
    assert_guard_refusal(
        l.enqueue(&failed, Action::Compensate).await,
        Action::Compensate,
        "compensate without succeeded steps",
    );
    assert_eq!(l.history(&failed).await.unwrap(), failed_history);
    assert_eq!(
        l.open_attempts().await.unwrap(),
        0,
        "a refused enqueue left an open attempt"
    );
    assert_nothing_claimable(l).await;
}

/// Retry after a failure and compensate after succeeded steps are accepted;
/// compensate's receipts are the succeeded steps, reversed.
pub async fn retry_after_failure_and_compensate_after_success_are_accepted<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 3).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    fail_at(l, "w", 3).await;

    // Compensating a failed forward attempt undoes its two succeeded steps.
    let comp = l.enqueue(&plan, Action::Compensate).await.unwrap();
    let codes: Vec<&str> = comp.receipts.iter().map(|r| r.step_code.as_str()).collect();
    assert_eq!(codes, ["step-2", "step-1"]);
    let ordinals: Vec<u32> = comp.receipts.iter().map(|r| r.ordinal).collect();
    assert_eq!(ordinals, [1, 2]);
    assert_eq!(comp.attempt.number, 2);
    l.abort(&comp.attempt.id, "not now").await.unwrap();

    let retry = l.enqueue(&plan, Action::Retry).await.unwrap();
    assert_eq!((retry.attempt.number, retry.attempt.action), (3, Action::Retry));
    assert_eq!(retry.receipts.len(), 3);
    deliver(l, "w").await;

    let comp = l.enqueue(&plan, Action::Compensate).await.unwrap();
    let codes: Vec<&str> = comp.receipts.iter().map(|r| r.step_code.as_str()).collect();
    assert_eq!(codes, ["step-3", "step-2", "step-1"]);
    assert_eq!(comp.attempt.number, 4);
    for r in &comp.receipts {
        assert_eq!(
            r.idempotency_key,
            idempotency_key(&comp.attempt.id, r.ordinal, &r.step_code)
        );
    }
}

// ---------------------------------------------------------------------------------
// Claim and heartbeat

/// Claim: command PROCESSING under a fresh lease, delivery_count 1, attempt RUNNING,
/// and nothing else claimable.
pub async fn claim_makes_the_command_processing_and_the_attempt_running_and_leaves_nothing_claimable<L: Ledger>(
    h: Harness<L>,
) {
    let l = &h.ledger;
    let plan_id = register(l, "p", "resume", 3).await;
    let plan = l.plan(&plan_id).await.unwrap();
    let queued = l.enqueue(&plan_id, Action::Execute).await.unwrap();
    h.advance_ms(250);
    let now = h.now();
    let c = claim_one(l, "worker-a").await;

    assert_eq!(c.lease.attempt_id, queued.attempt.id);
    assert_eq!(c.lease.command_id, queued.command.id);
    assert_eq!(c.plan, plan);
    let cmd = &c.record.command;
    assert_eq!(cmd.status, CommandStatus::Processing);
    assert_eq!(cmd.lease_owner.as_deref(), Some("worker-a"));
    assert_eq!(cmd.lease_until, Some(now.plus_ms(LEASE_MS)));
    assert_eq!(cmd.last_heartbeat_at, Some(now));
    assert_eq!(cmd.delivery_count, 1);
    assert_eq!(cmd.last_error, None);
    assert_eq!(c.record.attempt.status, AttemptStatus::Running);
    assert_eq!(c.record.attempt.started_at, Some(now));
    assert_eq!(
        c.record.receipts, queued.receipts,
        "a first claim must not touch the receipts"
    );
    assert_eq!(
        record(l, &queued.attempt.id).await,
        c.record,
        "claim answered a record other than the stored one"
    );

    assert_nothing_claimable(l).await;
    let other = h.open_handle().await;
    assert_nothing_claimable(&other).await;
    h.advance_ms(LEASE_MS);
    assert_nothing_claimable(&other).await;
    assert_eq!(l.open_attempts().await.unwrap(), 1);
}

/// Claim answers at most `batch` commands, each once.
pub async fn claim_answers_at_most_the_batch<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let mut attempts = BTreeSet::new();
    for i in 0..3 {
        let plan = register(l, &format!("p{i}"), "resume", 1).await;
        attempts.insert(l.enqueue(&plan, Action::Execute).await.unwrap().attempt.id);
        h.advance_ms(1);
    }
    let first = l.claim("w", 2, LEASE_MS).await.unwrap();
    assert_eq!(first.len(), 2);
    let second = l.claim("w", 2, LEASE_MS).await.unwrap();
    assert_eq!(second.len(), 1);
    assert!(l.claim("w", 2, LEASE_MS).await.unwrap().is_empty());
    let claimed: BTreeSet<AttemptId> = first
        .iter()
        .chain(&second)
        .map(|c| c.lease.attempt_id.clone())
        .collect();
    assert_eq!(claimed, attempts);
    let tokens: BTreeSet<&str> = first.iter().chain(&second).map(|c| c.lease.token.expose()).collect();
    assert_eq!(tokens.len(), 3, "every lease needs its own token");
}

/// Heartbeat renews `lease_until` from the ledger clock's now.
pub async fn heartbeat_renews_the_lease_on_the_ledger_clock<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 2).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = claim_one(l, "w").await;
    h.advance_ms(10_000);
    let now = h.now();
    let until = l.heartbeat(&c.lease, 45_000).await.unwrap();
    assert_eq!(until, now.plus_ms(45_000));
    let after = record(l, &c.lease.attempt_id).await;
    assert_eq!(after.command.lease_until, Some(until));
    assert_eq!(after.command.last_heartbeat_at, Some(now));
    assert_eq!(after.command.status, CommandStatus::Processing);
    assert_eq!(after.command.delivery_count, 1);
    assert_eq!(after.attempt, c.record.attempt);
    assert_eq!(after.receipts, c.record.receipts);

    // Renewed past the original deadline: still not claimable.
    h.advance_ms(LEASE_MS);
    assert_nothing_claimable(l).await;
    let until = l.heartbeat(&c.lease, LEASE_MS).await.unwrap();
    assert_eq!(until, h.now().plus_ms(LEASE_MS));
}

/// Begin and complete renew the lease too.
pub async fn step_writes_renew_the_lease_on_the_ledger_clock<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 1).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = claim_one(l, "w").await;
    h.advance_ms(20_000);
    l.begin_step(&c.lease, 1, 40_000).await.unwrap();
    let after = record(l, &c.lease.attempt_id).await;
    assert_eq!(after.command.lease_until, Some(h.now().plus_ms(40_000)));
    assert_eq!(after.command.last_heartbeat_at, Some(h.now()));
    assert_eq!(after.receipts[0].started_at, Some(h.now()));
    h.advance_ms(35_000);
    l.complete_step(&c.lease, 1, &evidence("w", 1), &target(1), 50_000)
        .await
        .unwrap();
    let after = record(l, &c.lease.attempt_id).await;
    assert_eq!(after.command.lease_until, Some(h.now().plus_ms(50_000)));
    assert_eq!(after.command.last_heartbeat_at, Some(h.now()));
    assert_eq!(after.receipts[0].finished_at, Some(h.now()));
}

// ---------------------------------------------------------------------------------
// Steps, finish, fail

/// The happy path: every step begun and completed, evidence stored canonically with
/// its SHA-256, the attempt SUCCEEDED and the command DELIVERED.
pub async fn begin_complete_finish_delivers_with_canonical_evidence_and_its_sha256<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "six", "replay", 6).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = claim_one(l, "w").await;
    let lease = &c.lease;
    for ordinal in 1..=6u32 {
        h.advance_ms(100);
        l.begin_step(lease, ordinal, LEASE_MS).await.unwrap();
        let mid = record(l, &lease.attempt_id).await;
        let r = mid.receipt(ordinal).unwrap();
        assert_eq!(r.status, ReceiptStatus::Running);
        assert_eq!(r.started_at, Some(h.now()));
        // Written with keys out of order and an integral float: stored canonically.
        let ev = json!({"zeta": [3, 1], "alpha": {"y": 2.0, "x": "é"}, "step": ordinal});
        let tr = json!({"ref": format!("t-{ordinal}"), "at": 1});
        h.advance_ms(100);
        l.complete_step(lease, ordinal, &ev, &tr, LEASE_MS).await.unwrap();
        let done = record(l, &lease.attempt_id).await;
        let r = done.receipt(ordinal).unwrap();
        let canonical = format!(r#"{{"alpha":{{"x":"é","y":2}},"step":{ordinal},"zeta":[3,1]}}"#);
        assert_eq!(canonical, canonical_json(&ev));
        assert_eq!(r.status, ReceiptStatus::Succeeded);
        assert_eq!(r.evidence.as_deref(), Some(canonical.as_str()));
        assert_eq!(
            r.evidence_sha256.as_deref(),
            Some(sha256_hex(canonical.as_bytes()).as_str())
        );
        assert_eq!(
            r.target_receipt.as_deref(),
            Some(format!(r#"{{"at":1,"ref":"t-{ordinal}"}}"#).as_str())
        );
        assert_eq!(r.finished_at, Some(h.now()));
        assert_eq!(r.error, None);
    }
    h.advance_ms(100);
    let before_finish = record(l, &lease.attempt_id).await;
    l.finish(lease).await.unwrap();
    let done = record(l, &lease.attempt_id).await;
    assert_eq!(done.attempt.status, AttemptStatus::Succeeded);
    assert_eq!(done.attempt.finished_at, Some(h.now()));
    assert_eq!(done.attempt.error, None);
    assert_eq!(done.command.status, CommandStatus::Delivered);
    assert_eq!(done.command.lease_token, None, "finish must clear the token");
    assert_eq!(done.command.finished_at, Some(h.now()));
    assert_eq!(done.command.delivery_count, 1);
    assert_eq!(
        done.receipts, before_finish.receipts,
        "finish must not touch the receipts"
    );
    assert!(done.receipts.iter().all(|r| r.status == ReceiptStatus::Succeeded));
    assert_eq!(l.open_attempts().await.unwrap(), 0);
    assert_nothing_claimable(l).await;
    // Terminal: the finished lease is fenced like any stale one.
    assert_every_write_is_stale(l, lease, 6).await;
    assert_eq!(record(l, &lease.attempt_id).await, done);
}

/// Begin refuses a step whose predecessors have not all succeeded; finish refuses an
/// incomplete attempt. Neither writes anything.
pub async fn begin_step_out_of_order_is_refused_and_changes_nothing<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 3).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = claim_one(l, "w").await;
    h.advance_ms(1_000);
    let before = record(l, &c.lease.attempt_id).await;
    let err = l.begin_step(&c.lease, 2, LEASE_MS).await.unwrap_err();
    assert!(
        matches!(err, LedgerError::Refused(Refusal::OutOfOrder { ordinal: 2, .. })),
        "{err:?}"
    );
    let err = l.begin_step(&c.lease, 9, LEASE_MS).await.unwrap_err();
    assert!(
        matches!(err, LedgerError::Refused(Refusal::OutOfOrder { ordinal: 9, .. })),
        "{err:?}"
    );
    let err = l
        .complete_step(&c.lease, 1, &evidence("w", 1), &target(1), LEASE_MS)
        .await
        .unwrap_err();
    assert!(
        matches!(err, LedgerError::Refused(Refusal::OutOfOrder { ordinal: 1, .. })),
        "{err:?}"
    );
    let err = l.finish(&c.lease).await.unwrap_err();
    assert!(
        matches!(err, LedgerError::Refused(Refusal::OutOfOrder { ordinal: 1, .. })),
        "{err:?}"
    );
    assert_eq!(
        record(l, &c.lease.attempt_id).await,
        before,
        "a refused step write changed the record"
    );

    run_step(l, &c.lease, "w", 1).await;
    let err = l.begin_step(&c.lease, 1, LEASE_MS).await.unwrap_err();
    assert!(
        matches!(err, LedgerError::Refused(Refusal::OutOfOrder { ordinal: 1, .. })),
        "{err:?}"
    );
}

/// A retried begin (step already RUNNING) and a retried complete (same evidence)
/// succeed without changing the receipt; complete with other evidence is refused.
pub async fn retried_begin_and_complete_are_idempotent<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 2).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = claim_one(l, "w").await;
    l.begin_step(&c.lease, 1, LEASE_MS).await.unwrap();
    let begun = record(l, &c.lease.attempt_id).await;
    h.advance_ms(1_000);
    l.begin_step(&c.lease, 1, LEASE_MS).await.unwrap();
    let again = record(l, &c.lease.attempt_id).await;
    assert_eq!(again.receipts, begun.receipts);
    assert_eq!(again.command.lease_until, Some(h.now().plus_ms(LEASE_MS)));

    l.complete_step(&c.lease, 1, &evidence("w", 1), &target(1), LEASE_MS)
        .await
        .unwrap();
    let completed = record(l, &c.lease.attempt_id).await;
    h.advance_ms(1_000);
    l.complete_step(&c.lease, 1, &evidence("w", 1), &target(1), LEASE_MS)
        .await
        .unwrap();
    assert_eq!(record(l, &c.lease.attempt_id).await.receipts, completed.receipts);
    let err = l
        .complete_step(&c.lease, 1, &evidence("someone else", 1), &target(1), LEASE_MS)
        .await
        .unwrap_err();
    assert!(
        matches!(err, LedgerError::Refused(Refusal::OutOfOrder { ordinal: 1, .. })),
        "{err:?}"
    );
    assert_eq!(record(l, &c.lease.attempt_id).await.receipts, completed.receipts);
}

/// Fail: the step FAILED, later receipts ABORTED, earlier ones kept, the attempt and
/// command FAILED with the error, the token cleared.
pub async fn fail_aborts_later_receipts_and_fails_the_attempt_and_command<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "six", "resume", 6).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = claim_one(l, "w").await;
    run_step(l, &c.lease, "w", 1).await;
    run_step(l, &c.lease, "w", 2).await;
    l.begin_step(&c.lease, 3, LEASE_MS).await.unwrap();
    let before = record(l, &c.lease.attempt_id).await;
    h.advance_ms(700);
    l.fail(&c.lease, Some(3), "boom").await.unwrap();
    let after = record(l, &c.lease.attempt_id).await;
    let statuses: Vec<ReceiptStatus> = after.receipts.iter().map(|r| r.status).collect();
    use ReceiptStatus::{Aborted, Failed, Succeeded};
    assert_eq!(statuses, [Succeeded, Succeeded, Failed, Aborted, Aborted, Aborted]);
    assert_eq!(
        after.receipts[..2],
        before.receipts[..2],
        "fail must keep the succeeded receipts"
    );
    assert_eq!(after.receipts[2].error.as_deref(), Some("boom"));
    for r in &after.receipts[2..] {
        assert_eq!(r.finished_at, Some(h.now()));
        assert_eq!(r.evidence, None);
    }
    assert_eq!(after.attempt.status, AttemptStatus::Failed);
    assert_eq!(after.attempt.error.as_deref(), Some("boom"));
    assert_eq!(after.attempt.finished_at, Some(h.now()));
    assert_eq!(after.command.status, CommandStatus::Failed);
    assert_eq!(after.command.last_error.as_deref(), Some("boom"));
    assert_eq!(after.command.lease_token, None);
    assert_eq!(after.command.finished_at, Some(h.now()));
    assert_eq!(l.open_attempts().await.unwrap(), 0);
    assert_nothing_claimable(l).await;
    assert_every_write_is_stale(l, &c.lease, 4).await;
    assert_eq!(record(l, &c.lease.attempt_id).await, after);

    // Fail without a step: every open receipt ABORTED.
    let plan = register(l, "three", "resume", 3).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = claim_one(l, "w").await;
    run_step(l, &c.lease, "w", 1).await;
    l.fail(&c.lease, None, "gave up").await.unwrap();
    let after = record(l, &c.lease.attempt_id).await;
    let statuses: Vec<ReceiptStatus> = after.receipts.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [Succeeded, Aborted, Aborted]);
    assert_eq!(
        (after.attempt.status, after.command.status),
        (AttemptStatus::Failed, CommandStatus::Failed)
    );
}

// ---------------------------------------------------------------------------------
// Fencing

/// Each worker transition under a token other than the current one is refused as
/// stale and changes nothing.
pub async fn worker_transitions_with_a_stale_token_are_refused_and_change_nothing<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 3).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = claim_one(l, "w").await;
    run_step(l, &c.lease, "w", 1).await;
    l.begin_step(&c.lease, 2, LEASE_MS).await.unwrap();
    h.advance_ms(1_000);
    let before = record(l, &c.lease.attempt_id).await;
    let forged = Lease {
        token: LeaseToken::new("not-the-token"),
        ..c.lease.clone()
    };
    // Ordinal 2 is RUNNING, so each write would be legal under the real token.
    assert_every_write_is_stale(l, &forged, 2).await;
    let other = h.open_handle().await;
    assert_every_write_is_stale(&other, &forged, 2).await;
    assert_eq!(
        record(l, &c.lease.attempt_id).await,
        before,
        "a stale write changed the record"
    );
    // The real holder is unaffected.
    l.complete_step(&c.lease, 2, &evidence("w", 2), &target(2), LEASE_MS)
        .await
        .unwrap();
}

/// A command that was never claimed has no current token: worker writes are refused.
pub async fn worker_transitions_on_an_unclaimed_command_are_refused<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 2).await;
    let queued = l.enqueue(&plan, Action::Execute).await.unwrap();
    let forged = Lease {
        command_id: queued.command.id.clone(),
        attempt_id: queued.attempt.id.clone(),
        token: LeaseToken::new("x"),
    };
    assert_every_write_is_stale(l, &forged, 1).await;
    assert_eq!(record(l, &queued.attempt.id).await, queued);
}

/// Before its deadline has passed, a lease is not claimable by anyone.
pub async fn a_live_lease_is_never_taken_over<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 1).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = claim_one(l, "a").await;
    let other = h.open_handle().await;
    h.advance_ms(LEASE_MS - 1);
    assert_nothing_claimable(&other).await;
    // `lease_until < now` is the rule: at the deadline itself the lease still holds.
    h.advance_ms(1);
    assert_eq!(Some(h.now()), c.record.command.lease_until);
    assert_nothing_claimable(&other).await;
    assert_eq!(record(l, &c.lease.attempt_id).await, c.record);
    l.heartbeat(&c.lease, LEASE_MS).await.unwrap();
}

/// After the lease expires a new owner claims it (delivery 2); every write of the
/// old holder is refused and the record stays as the new holder's claim left it.
pub async fn after_expiry_another_owner_takes_over_and_the_old_holder_is_fenced<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 3).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let old = claim_one(l, "worker-a").await;
    run_step(l, &old.lease, "worker-a", 1).await;
    l.begin_step(&old.lease, 2, LEASE_MS).await.unwrap();
    h.advance_ms(LEASE_MS + 1);

    let other = h.open_handle().await;
    let now = h.now();
    let new = claim_one(&other, "worker-b").await;
    assert_eq!(new.lease.attempt_id, old.lease.attempt_id);
    assert_eq!(new.lease.command_id, old.lease.command_id);
    assert_ne!(new.lease.token, old.lease.token);
    let cmd = &new.record.command;
    assert_eq!(cmd.status, CommandStatus::Processing);
    assert_eq!(cmd.delivery_count, 2);
    assert_eq!(cmd.lease_owner.as_deref(), Some("worker-b"));
    assert_eq!(cmd.lease_until, Some(now.plus_ms(LEASE_MS)));
    assert_eq!(cmd.last_heartbeat_at, Some(now));
    assert!(
        cmd.last_error.as_deref().is_some_and(|e| e.contains("worker-a")),
        "{:?}",
        cmd.last_error
    );
    assert_eq!(new.record.attempt.status, AttemptStatus::Running);
    assert_eq!(
        new.record.attempt.started_at, old.record.attempt.started_at,
        "started_at is the first claim's"
    );

    for ordinal in 1..=3 {
        assert_every_write_is_stale(l, &old.lease, ordinal).await;
    }
    assert_eq!(
        record(l, &old.lease.attempt_id).await,
        new.record,
        "the old holder changed the new holder's record"
    );
    assert_eq!(record(&other, &old.lease.attempt_id).await, new.record);

    // The new holder carries on: step 1 stays done, step 2 is redelivered.
    run_step(&other, &new.lease, "worker-b", 2).await;
    run_step(&other, &new.lease, "worker-b", 3).await;
    other.finish(&new.lease).await.unwrap();
    let done = record(l, &old.lease.attempt_id).await;
    assert_eq!(done.attempt.status, AttemptStatus::Succeeded);
    assert_eq!(done.command.status, CommandStatus::Delivered);
    assert_eq!(done.command.delivery_count, 2);
    assert_eq!(
        done.receipts[0].evidence.as_deref(),
        Some(canonical_json(&evidence("worker-a", 1)).as_str())
    );
    assert_eq!(
        done.receipts[1].evidence.as_deref(),
        Some(canonical_json(&evidence("worker-b", 2)).as_str())
    );
}

/// Resume: a takeover keeps succeeded receipts as they were and puts the ambiguous
/// RUNNING one back to PENDING with the same idempotency key.
pub async fn resume_takeover_keeps_succeeded_receipts_and_resets_the_running_one_with_the_same_key<L: Ledger>(
    h: Harness<L>,
) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 4).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let old = claim_one(l, "a").await;
    run_step(l, &old.lease, "a", 1).await;
    run_step(l, &old.lease, "a", 2).await;
    l.begin_step(&old.lease, 3, LEASE_MS).await.unwrap();
    let before = record(l, &old.lease.attempt_id).await;
    h.advance_ms(LEASE_MS + 1);
    let new = claim_one(l, "b").await;
    let after = &new.record.receipts;
    assert_eq!(
        after[..2],
        before.receipts[..2],
        "resume must keep succeeded receipts untouched"
    );
    assert_eq!(after[2].status, ReceiptStatus::Pending);
    assert_eq!(after[2].started_at, None);
    assert_eq!(after[2].idempotency_key, before.receipts[2].idempotency_key);
    assert_eq!(after[3], before.receipts[3]);
    for (a, b) in after.iter().zip(&before.receipts) {
        assert_eq!(a.idempotency_key, b.idempotency_key);
    }
    // The new holder redelivers step 3 only.
    let err = l.begin_step(&new.lease, 1, LEASE_MS).await.unwrap_err();
    assert!(
        matches!(err, LedgerError::Refused(Refusal::OutOfOrder { ordinal: 1, .. })),
        "{err:?}"
    );
    run_step(l, &new.lease, "b", 3).await;
    run_step(l, &new.lease, "b", 4).await;
    l.finish(&new.lease).await.unwrap();
}

/// Replay: a takeover resets every receipt to PENDING and drops its evidence; keys
/// stay the same.
pub async fn replay_takeover_resets_every_receipt_and_drops_evidence<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "replay", 4).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let old = claim_one(l, "a").await;
    run_step(l, &old.lease, "a", 1).await;
    run_step(l, &old.lease, "a", 2).await;
    l.begin_step(&old.lease, 3, LEASE_MS).await.unwrap();
    let before = record(l, &old.lease.attempt_id).await;
    h.advance_ms(LEASE_MS + 1);
    let new = claim_one(l, "b").await;
    assert_eq!(new.record.command.delivery_count, 2);
    for (r, b) in new.record.receipts.iter().zip(&before.receipts) {
        assert_eq!(r.status, ReceiptStatus::Pending, "step {}", r.ordinal);
        assert_eq!(
            (&r.evidence, &r.evidence_sha256, &r.target_receipt),
            (&None, &None, &None),
            "step {}",
            r.ordinal
        );
        assert_eq!(
            (r.started_at, r.finished_at, r.error.as_deref()),
            (None, None, None),
            "step {}",
            r.ordinal
        );
        assert_eq!(r.idempotency_key, b.idempotency_key);
        assert_eq!(r.step_code, b.step_code);
    }
    assert_eq!(record(l, &old.lease.attempt_id).await, new.record);
    assert_every_write_is_stale(l, &old.lease, 3).await;
    // The new holder replays from the first step.
    for ordinal in 1..=4 {
        run_step(l, &new.lease, "b", ordinal).await;
    }
    l.finish(&new.lease).await.unwrap();
    let done = record(l, &old.lease.attempt_id).await;
    assert!(done
        .receipts
        .iter()
        .all(|r| r.evidence.as_deref().is_some_and(|e| e.contains("\"b\""))));
}

// ---------------------------------------------------------------------------------
// Operator transitions

/// Reconcile leaves a PENDING command alone.
pub async fn reconcile_leaves_a_pending_command_unchanged<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 2).await;
    let queued = l.enqueue(&plan, Action::Execute).await.unwrap();
    h.advance_ms(LEASE_MS * 10);
    let (outcome, rec) = l.reconcile(&queued.attempt.id).await.unwrap();
    assert_eq!(outcome, ReconcileOutcome::Unchanged);
    assert_eq!(rec, queued);
    assert_eq!(record(l, &queued.attempt.id).await, queued);
}

/// Reconcile refuses a live lease and leaves it with its holder.
pub async fn reconcile_refuses_a_live_lease<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 2).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = claim_one(l, "holder").await;
    l.begin_step(&c.lease, 1, LEASE_MS).await.unwrap();
    let before = record(l, &c.lease.attempt_id).await;
    h.advance_ms(LEASE_MS);
    let err = l.reconcile(&c.lease.attempt_id).await.unwrap_err();
    match err {
        LedgerError::Refused(Refusal::LiveLease { command, owner, until }) => {
            assert_eq!(command, c.lease.command_id);
            assert_eq!(owner, "holder");
            assert_eq!(Some(until), before.command.lease_until);
        }
        other => panic!("expected Refused(LiveLease), got {other:?}"),
    }
    assert_eq!(record(l, &c.lease.attempt_id).await, before);
    l.complete_step(&c.lease, 1, &evidence("holder", 1), &target(1), LEASE_MS)
        .await
        .unwrap();
}

/// Reconcile of an expired lease: command PENDING and available now, token cleared,
/// the running receipt reset, the attempt QUEUED; the old holder is fenced and the
/// next claim is delivery 2.
pub async fn reconcile_requeues_an_expired_lease_and_fences_its_holder<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 3).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = claim_one(l, "holder").await;
    run_step(l, &c.lease, "holder", 1).await;
    l.begin_step(&c.lease, 2, LEASE_MS).await.unwrap();
    let before = record(l, &c.lease.attempt_id).await;
    h.advance_ms(LEASE_MS + 1);
    let oldest_lease = || async { l.count_attempts(10).await.unwrap().oldest_lease_until };
    assert_eq!(
        oldest_lease().await,
        before.command.lease_until,
        "the expired lease is counted"
    );
    let (outcome, rec) = l.reconcile(&c.lease.attempt_id).await.unwrap();
    assert_eq!(outcome, ReconcileOutcome::Requeued);
    assert_eq!(oldest_lease().await, None, "a requeued command holds no lease");
    assert_eq!(rec.attempt.status, AttemptStatus::Queued);
    assert_eq!(rec.command.status, CommandStatus::Pending);
    assert_eq!(rec.command.available_at, h.now());
    assert_eq!(
        (rec.command.lease_token.as_ref(), rec.command.lease_owner.as_deref()),
        (None, None)
    );
    assert_eq!(rec.command.lease_until, None);
    assert_eq!(rec.command.delivery_count, 1);
    assert!(rec.command.last_error.is_some());
    assert_eq!(rec.receipts[0], before.receipts[0]);
    assert_eq!(rec.receipts[1].status, ReceiptStatus::Pending);
    assert_eq!(rec.receipts[1].idempotency_key, before.receipts[1].idempotency_key);
    assert_eq!(record(l, &c.lease.attempt_id).await, rec);
    assert_eq!(l.open_attempts().await.unwrap(), 1);

    assert_every_write_is_stale(l, &c.lease, 2).await;
    assert_eq!(record(l, &c.lease.attempt_id).await, rec);

    let again = claim_one(l, "next").await;
    assert_eq!(again.record.command.delivery_count, 2);
    assert_eq!(again.record.attempt.status, AttemptStatus::Running);
    assert_eq!(again.record.receipts, rec.receipts);
    run_step(l, &again.lease, "next", 2).await;
}

/// Reconcile of a terminal attempt answers it unchanged.
pub async fn reconcile_leaves_a_terminal_attempt_unchanged<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 2).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = deliver(l, "w").await;
    h.advance_ms(LEASE_MS * 3);
    let done = record(l, &c.lease.attempt_id).await;
    let (outcome, rec) = l.reconcile(&c.lease.attempt_id).await.unwrap();
    assert_eq!(outcome, ReconcileOutcome::Unchanged);
    assert_eq!(rec, done);
    assert_eq!(record(l, &c.lease.attempt_id).await, done);

    let failed_plan = register(l, "f", "resume", 2).await;
    l.enqueue(&failed_plan, Action::Execute).await.unwrap();
    let f = fail_at(l, "w", 1).await;
    let failed = record(l, &f.lease.attempt_id).await;
    let (outcome, rec) = l.reconcile(&f.lease.attempt_id).await.unwrap();
    assert_eq!((outcome, rec), (ReconcileOutcome::Unchanged, failed.clone()));
    assert_eq!(record(l, &f.lease.attempt_id).await, failed);
}

/// Abort of a RUNNING attempt: attempt, open receipts and command ABORTED, token
/// cleared; the worker's next write is refused and changes nothing.
pub async fn abort_fences_the_active_worker<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 3).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = claim_one(l, "w").await;
    run_step(l, &c.lease, "w", 1).await;
    l.begin_step(&c.lease, 2, LEASE_MS).await.unwrap();
    let before = record(l, &c.lease.attempt_id).await;
    h.advance_ms(5);
    let other = h.open_handle().await;
    let rec = other.abort(&c.lease.attempt_id, "operator said so").await.unwrap();
    assert_eq!(rec.attempt.status, AttemptStatus::Aborted);
    assert_eq!(rec.attempt.error.as_deref(), Some("operator said so"));
    assert_eq!(rec.attempt.finished_at, Some(h.now()));
    assert_eq!(rec.command.status, CommandStatus::Aborted);
    assert_eq!(rec.command.lease_token, None);
    assert_eq!(rec.command.finished_at, Some(h.now()));
    assert_eq!(
        rec.receipts[0], before.receipts[0],
        "abort must keep succeeded receipts"
    );
    assert_eq!(rec.receipts[1].status, ReceiptStatus::Aborted);
    assert_eq!(rec.receipts[2].status, ReceiptStatus::Aborted);
    assert_eq!(record(l, &c.lease.attempt_id).await, rec);

    assert_stale(
        l.complete_step(&c.lease, 2, &evidence("w", 2), &target(2), LEASE_MS)
            .await,
        &c.lease.command_id,
        "complete after abort",
    );
    assert_every_write_is_stale(l, &c.lease, 2).await;
    assert_eq!(
        record(l, &c.lease.attempt_id).await,
        rec,
        "a fenced worker changed an aborted record"
    );
    assert_eq!(l.open_attempts().await.unwrap(), 0);
    h.advance_ms(LEASE_MS * 2);
    assert_nothing_claimable(l).await;
    // An aborted latest attempt may be retried.
    let retry = l.enqueue(&plan, Action::Retry).await.unwrap();
    assert_eq!(retry.attempt.number, 2);
}

/// Abort of a QUEUED attempt: no worker will ever claim it.
pub async fn abort_of_a_queued_attempt_makes_it_unclaimable<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 2).await;
    let queued = l.enqueue(&plan, Action::Execute).await.unwrap();
    let rec = l.abort(&queued.attempt.id, "changed my mind").await.unwrap();
    assert_eq!(rec.attempt.status, AttemptStatus::Aborted);
    assert_eq!(rec.command.status, CommandStatus::Aborted);
    assert!(rec.receipts.iter().all(|r| r.status == ReceiptStatus::Aborted));
    assert_nothing_claimable(l).await;
    assert_eq!(l.open_attempts().await.unwrap(), 0);
}

/// Abort of a terminal attempt is refused as Terminal and changes nothing.
pub async fn abort_of_a_terminal_attempt_is_refused<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 1).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = deliver(l, "w").await;
    let done = record(l, &c.lease.attempt_id).await;
    match l.abort(&c.lease.attempt_id, "too late").await {
        Err(LedgerError::Refused(Refusal::Terminal { attempt, status })) => {
            assert_eq!(attempt, c.lease.attempt_id);
            assert_eq!(status, AttemptStatus::Succeeded);
        }
        other => panic!("expected Refused(Terminal), got {other:?}"),
    }
    assert_eq!(record(l, &c.lease.attempt_id).await, done);

    let queued = l.enqueue(&plan, Action::Compensate).await.unwrap();
    let aborted = l.abort(&queued.attempt.id, "no").await.unwrap();
    match l.abort(&queued.attempt.id, "again").await {
        Err(LedgerError::Refused(Refusal::Terminal {
            status: AttemptStatus::Aborted,
            ..
        })) => {}
        other => panic!("expected Refused(Terminal ABORTED), got {other:?}"),
    }
    assert_eq!(record(l, &queued.attempt.id).await, aborted);
}

/// Unknown plan and attempt ids answer NotFound.
pub async fn unknown_plan_and_attempt_ids_are_not_found<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = PlanId::new("pln-missing");
    let attempt = AttemptId::new("att-missing");
    assert_not_found(l.plan(&plan).await, "plan", "pln-missing", "plan");
    assert_not_found(l.retire_plan(&plan).await, "plan", "pln-missing", "retire_plan");
    assert_not_found(
        l.enqueue(&plan, Action::Execute).await,
        "plan",
        "pln-missing",
        "enqueue",
    );
    assert_not_found(l.history(&plan).await, "plan", "pln-missing", "history");
    assert_not_found(l.attempt(&attempt).await, "attempt", "att-missing", "attempt");
    assert_not_found(l.reconcile(&attempt).await, "attempt", "att-missing", "reconcile");
    assert_not_found(l.abort(&attempt, "x").await, "attempt", "att-missing", "abort");
    // A lease naming an attempt that does not exist.
    let lease = Lease {
        command_id: CommandId::new("cmd-missing"),
        attempt_id: attempt,
        token: LeaseToken::new("t"),
    };
    for (what, outcome) in worker_writes(l, &lease).await {
        assert_not_found(outcome, "attempt", "att-missing", what);
    }
    assert_eq!(l.list_plans().await.unwrap(), Vec::new());
    assert_eq!(l.open_attempts().await.unwrap(), 0);

    // A lease naming a real, claimed attempt but a command that is not its own.
    let plan = register(l, "p", "resume", 1).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = claim_one(l, "w").await;
    let before = record(l, &c.lease.attempt_id).await;
    let crossed = Lease {
        command_id: CommandId::new("cmd-missing"),
        ..c.lease.clone()
    };
    for (what, outcome) in worker_writes(l, &crossed).await {
        assert_not_found(outcome, "command", "cmd-missing", what);
    }
    assert_eq!(record(l, &c.lease.attempt_id).await, before);
}

/// The outcome of every worker write under `lease` (at step 1), named.
async fn worker_writes<L: Ledger>(l: &L, lease: &Lease) -> Vec<(&'static str, Result<(), LedgerError>)> {
    vec![
        ("heartbeat", l.heartbeat(lease, LEASE_MS).await.map(drop)),
        ("begin_step", l.begin_step(lease, 1, LEASE_MS).await),
        (
            "complete_step",
            l.complete_step(lease, 1, &json!({}), &json!({}), LEASE_MS).await,
        ),
        ("fail", l.fail(lease, Some(1), "x").await),
        ("finish", l.finish(lease).await),
    ]
}

// ---------------------------------------------------------------------------------
// Reads

/// `open_attempts` counts QUEUED and RUNNING attempts across plans.
pub async fn open_attempts_counts_queued_and_running<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    assert_eq!(l.open_attempts().await.unwrap(), 0);
    let mut plans = Vec::new();
    for i in 0..4 {
        let plan = register(l, &format!("p{i}"), "resume", 1).await;
        l.enqueue(&plan, Action::Execute).await.unwrap();
        plans.push(plan);
        h.advance_ms(1);
    }
    assert_eq!(l.open_attempts().await.unwrap(), 4);
    let claimed = l.claim("w", 2, LEASE_MS).await.unwrap();
    assert_eq!(claimed.len(), 2);
    assert_eq!(
        l.open_attempts().await.unwrap(),
        4,
        "claiming does not close an attempt"
    );
    run_step(l, &claimed[0].lease, "w", 1).await;
    l.finish(&claimed[0].lease).await.unwrap();
    assert_eq!(l.open_attempts().await.unwrap(), 3);
    l.fail(&claimed[1].lease, None, "no").await.unwrap();
    assert_eq!(l.open_attempts().await.unwrap(), 2);
    let rest = l.claim("w", 10, LEASE_MS).await.unwrap();
    assert_eq!(rest.len(), 2);
    l.abort(&rest[0].lease.attempt_id, "stop").await.unwrap();
    assert_eq!(l.open_attempts().await.unwrap(), 1);
    h.advance_ms(LEASE_MS + 1);
    l.reconcile(&rest[1].lease.attempt_id).await.unwrap();
    assert_eq!(l.open_attempts().await.unwrap(), 1, "a requeued attempt is still open");
    l.abort(&rest[1].lease.attempt_id, "stop").await.unwrap();
    assert_eq!(l.open_attempts().await.unwrap(), 0);
}

/// `history` answers every attempt of the plan (and only that plan), by number.
pub async fn history_is_ordered_by_number<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "p", "resume", 2).await;
    let noise = register(l, "noise", "resume", 1).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    fail_at(l, "w", 2).await;
    let r2 = l.enqueue(&plan, Action::Retry).await.unwrap();
    l.abort(&r2.attempt.id, "no").await.unwrap();
    l.enqueue(&noise, Action::Execute).await.unwrap();
    deliver(l, "w").await;
    l.enqueue(&plan, Action::Retry).await.unwrap();
    deliver(l, "w").await;
    l.enqueue(&plan, Action::Compensate).await.unwrap();

    let history = l.history(&plan).await.unwrap();
    let numbers: Vec<u32> = history.iter().map(|r| r.attempt.number).collect();
    assert_eq!(numbers, [1, 2, 3, 4]);
    let actions: Vec<Action> = history.iter().map(|r| r.attempt.action).collect();
    assert_eq!(
        actions,
        [Action::Execute, Action::Retry, Action::Retry, Action::Compensate]
    );
    let statuses: Vec<AttemptStatus> = history.iter().map(|r| r.attempt.status).collect();
    use AttemptStatus::{Aborted, Failed, Queued, Succeeded};
    assert_eq!(statuses, [Failed, Aborted, Succeeded, Queued]);
    assert!(history.iter().all(|r| r.attempt.plan_id == plan));
    for r in &history {
        assert_eq!(&record(l, &r.attempt.id).await, r, "history and attempt disagree");
    }
    assert_eq!(l.history(&noise).await.unwrap().len(), 1);
}

/// A retired plan accepts no new attempt; its content may be registered again as a
/// new plan.
pub async fn retire_plan_makes_enqueue_refuse<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = l.register_plan(spec("p", "resume", 1), KNOWN).await.unwrap();
    l.enqueue(&plan.id, Action::Execute).await.unwrap();
    deliver(l, "w").await;
    let history = l.history(&plan.id).await.unwrap();
    let retired = l.retire_plan(&plan.id).await.unwrap();
    assert_eq!(retired.status, PlanStatus::Retired);
    assert_eq!(retired.id, plan.id);
    assert_eq!(retired.fingerprint, plan.fingerprint);
    assert_eq!(l.plan(&plan.id).await.unwrap(), retired);
    for action in [Action::Execute, Action::Retry, Action::Compensate] {
        assert_guard_refusal(l.enqueue(&plan.id, action).await, action, "enqueue on a retired plan");
    }
    assert_eq!(l.history(&plan.id).await.unwrap(), history);
    assert_eq!(l.open_attempts().await.unwrap(), 0);

    let again = l.register_plan(spec("p", "resume", 1), KNOWN).await.unwrap();
    assert_ne!(again.id, plan.id, "a retired plan must not answer a new registration");
    assert_eq!(again.status, PlanStatus::Ready);
    l.enqueue(&again.id, Action::Execute).await.unwrap();
}

/// `plans_named` answers exactly the plans of that name (byte for byte: not a prefix,
/// not another case), oldest first; `find_plan` takes an id, or else the newest READY
/// plan of that name, or else the newest of any status.
pub async fn plans_are_found_by_exact_name_newest_ready_first<L: Ledger>(h: Harness<L>) {
    use leasehold::ledger::find_plan;
    let l = &h.ledger;
    let first = register(l, "p", "resume", 1).await;
    l.retire_plan(&first).await.unwrap();
    let second = register(l, "p", "resume", 2).await;
    let other = register(l, "p2", "resume", 1).await;
    let upper = register(l, "P", "replay", 1).await;
    let third = register(l, "p", "replay", 3).await;
    let ids = |plans: Vec<leasehold::engine::Plan>| plans.into_iter().map(|p| p.id).collect::<Vec<_>>();

    assert_eq!(
        ids(l.plans_named("p").await.unwrap()),
        vec![first.clone(), second.clone(), third.clone()]
    );
    assert_eq!(ids(l.plans_named("p2").await.unwrap()), vec![other.clone()]);
    assert_eq!(ids(l.plans_named("P").await.unwrap()), vec![upper]);
    for absent in ["", "p%", "p_", "nope"] {
        assert!(l.plans_named(absent).await.unwrap().is_empty(), "{absent:?}");
    }

    assert_eq!(find_plan(l, "p").await.unwrap().id, third);
    assert_eq!(find_plan(l, first.as_str()).await.unwrap().id, first);
    l.retire_plan(&third).await.unwrap();
    assert_eq!(
        find_plan(l, "p").await.unwrap().id,
        second,
        "the newest READY plan of the name"
    );
    l.retire_plan(&second).await.unwrap();
    let newest = find_plan(l, "p").await.unwrap();
    assert_eq!(
        (newest.id, newest.status),
        (third, PlanStatus::Retired),
        "none READY: the newest"
    );
    assert_not_found(find_plan(l, "nope").await, "plan", "nope", "find_plan");
}

/// `plans_newest_first` pages back through the plans in registration order (not id
/// order), a retired plan included; an unknown `before` is not found.
pub async fn plans_page_newest_first_in_registration_order<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let mut registered = Vec::new();
    for i in 0..5 {
        registered.push(register(l, &format!("page-{i}"), "resume", 1).await);
    }
    l.retire_plan(&registered[2]).await.unwrap();
    let page = |before: Option<usize>, limit: u32| {
        let before = before.map(|i| registered[i].clone());
        async move {
            let plans = l.plans_newest_first(before.as_ref(), limit).await.unwrap();
            plans.into_iter().map(|p| p.id).collect::<Vec<_>>()
        }
    };
    let ids = |indexes: &[usize]| indexes.iter().map(|&i| registered[i].clone()).collect::<Vec<_>>();
    assert_eq!(page(None, 2).await, ids(&[4, 3]));
    assert_eq!(page(Some(3), 2).await, ids(&[2, 1]));
    assert_eq!(page(Some(1), 2).await, ids(&[0]));
    assert_eq!(page(Some(0), 2).await, ids(&[]));
    assert_eq!(page(None, 10).await, ids(&[4, 3, 2, 1, 0]));
    assert_eq!(page(Some(4), 0).await, ids(&[]));
    let unknown = PlanId::new("pln-missing");
    assert_not_found(
        l.plans_newest_first(Some(&unknown), 2).await,
        "plan",
        "pln-missing",
        "plans_newest_first",
    );
}

/// Writes through one handle are visible, whole, through every other handle.
pub async fn every_handle_sees_every_committed_write<L: Ledger>(h: Harness<L>) {
    let (a, b, c) = (&h.ledger, &h.open_handle().await, &h.open_handle().await);
    let plan = a.register_plan(spec("p", "replay", 2), KNOWN).await.unwrap();
    assert_eq!(b.plan(&plan.id).await.unwrap(), plan);
    assert_eq!(c.register_plan(spec("p", "replay", 2), KNOWN).await.unwrap(), plan);
    let queued = b.enqueue(&plan.id, Action::Execute).await.unwrap();
    assert_eq!(record(c, &queued.attempt.id).await, queued);
    let claimed = claim_one(c, "w").await;
    assert_eq!(record(a, &queued.attempt.id).await, claimed.record);
    run_step(a, &claimed.lease, "w", 1).await;
    run_step(b, &claimed.lease, "w", 2).await;
    c.finish(&claimed.lease).await.unwrap();
    let done = record(a, &queued.attempt.id).await;
    assert_eq!(done.attempt.status, AttemptStatus::Succeeded);
    assert_eq!(record(b, &queued.attempt.id).await, done);
    assert_eq!(c.history(&plan.id).await.unwrap(), vec![done]);
    assert_eq!(b.list_plans().await.unwrap(), vec![plan]);
    assert_eq!(c.open_attempts().await.unwrap(), 0);
}

// ---------------------------------------------------------------------------------
// Races

/// Calls `op` until it answers something other than `Unavailable` (busy: nothing was
/// written, retry), counting the retries.
async fn retry_busy<T, F, Fut>(busy: &AtomicU64, mut op: F) -> Result<T, LedgerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, LedgerError>>,
{
    for _ in 0..10_000 {
        match op().await {
            Err(LedgerError::Unavailable(_)) => {
                busy.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
            other => return other,
        }
    }
    panic!("the ledger stayed unavailable for 10,000 tries");
}

/// Eight claimers, each with its own handle and task, drain 1,000 commands: each is
/// claimed exactly once, and every attempt ends RUNNING at delivery 1.
pub async fn race_eight_claimers_claim_each_of_1000_commands_exactly_once<L: Ledger>(h: Harness<L>) {
    const COMMANDS: usize = 1_000;
    const CLAIMERS: usize = 8;
    let l = &h.ledger;
    let mut attempts = BTreeSet::new();
    let mut commands = BTreeSet::new();
    for i in 0..COMMANDS {
        let plan = register(l, &format!("race-{i:04}"), "resume", 1).await;
        let rec = l.enqueue(&plan, Action::Execute).await.unwrap();
        attempts.insert(rec.attempt.id);
        commands.insert(rec.command.id);
    }
    assert_eq!(l.open_attempts().await.unwrap(), COMMANDS as u64);

    let barrier = Arc::new(tokio::sync::Barrier::new(CLAIMERS));
    let busy = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..CLAIMERS {
        let handle = h.open_handle().await;
        let barrier = barrier.clone();
        let busy = busy.clone();
        tasks.push(tokio::spawn(async move {
            let owner = format!("claimer-{w}");
            let mut mine = Vec::new();
            barrier.wait().await;
            loop {
                let batch = retry_busy(&busy, || handle.claim(&owner, 5, LEASE_MS))
                    .await
                    .expect("claim");
                if batch.is_empty() {
                    break;
                }
                assert!(batch.len() <= 5, "claim answered {} > batch", batch.len());
                for c in batch {
                    assert_eq!(c.record.command.lease_owner.as_deref(), Some(owner.as_str()));
                    assert_eq!(c.record.command.delivery_count, 1);
                    mine.push((c.lease.command_id, c.lease.attempt_id));
                }
                tokio::task::yield_now().await;
            }
            mine
        }));
    }
    let mut all = Vec::new();
    let mut per_claimer = Vec::new();
    for t in tasks {
        let mine = t.await.expect("claimer task panicked");
        per_claimer.push(mine.len());
        all.extend(mine);
    }
    eprintln!(
        "claims per claimer: {per_claimer:?}; busy retries: {}",
        busy.load(Ordering::Relaxed)
    );
    assert_eq!(all.len(), COMMANDS, "claims per claimer: {per_claimer:?}");
    let claimed_commands: BTreeSet<CommandId> = all.iter().map(|(c, _)| c.clone()).collect();
    let claimed_attempts: BTreeSet<AttemptId> = all.iter().map(|(_, a)| a.clone()).collect();
    assert_eq!(claimed_commands.len(), COMMANDS, "some command was claimed twice");
    assert_eq!(claimed_commands, commands);
    assert_eq!(claimed_attempts, attempts);
    for attempt in &attempts {
        let rec = record(l, attempt).await;
        assert_eq!(rec.attempt.status, AttemptStatus::Running, "{attempt}");
        assert_eq!(rec.command.status, CommandStatus::Processing, "{attempt}");
        assert_eq!(rec.command.delivery_count, 1, "{attempt}");
    }
    assert_eq!(l.open_attempts().await.unwrap(), COMMANDS as u64);
    assert_nothing_claimable(l).await;
}

/// Waits (at most 30 s of real time) until the stale holder has finished another
/// round of writes after `seen`.
async fn stale_round_after(rounds: &AtomicU32, seen: u32) {
    let wait = async {
        while rounds.load(Ordering::SeqCst) <= seen {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), wait)
        .await
        .expect("the stale holder stopped making progress");
}

/// After a takeover the stale holder hammers every write concurrently with the new
/// holder's delivery (and at least one full round between any two of the new
/// holder's writes, aimed at the step it is on): every stale write is refused, every
/// new write succeeds, and the result is exactly the new holder's delivery.
pub async fn race_stale_holder_writes_are_refused_while_the_new_holder_proceeds<L: Ledger>(h: Harness<L>) {
    const STEPS: u32 = 12;
    let l = &h.ledger;
    let plan = register(l, "contested", "resume", STEPS as usize).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let old = claim_one(l, "stale").await;
    run_step(l, &old.lease, "stale", 1).await;
    l.begin_step(&old.lease, 2, LEASE_MS).await.unwrap();
    h.advance_ms(LEASE_MS + 1);

    let new_handle = h.open_handle().await;
    let new = claim_one(&new_handle, "fresh").await;
    assert_eq!(new.record.command.delivery_count, 2);

    let done = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU32::new(0));
    let current = Arc::new(AtomicU32::new(2));
    let busy = Arc::new(AtomicU64::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(2));
    let stale_handle = h.open_handle().await;
    let stale_task = {
        let (done, rounds, current, busy, start) = (
            done.clone(),
            rounds.clone(),
            current.clone(),
            busy.clone(),
            start.clone(),
        );
        let lease = old.lease.clone();
        tokio::spawn(async move {
            start.wait().await;
            let l = &stale_handle;
            let c = &lease.command_id;
            let mut refused = 0u32;
            while !done.load(Ordering::SeqCst) {
                let ordinal = current.load(Ordering::SeqCst);
                let (ev, tr) = (evidence("stale", ordinal), target(ordinal));
                assert_stale(
                    retry_busy(&busy, || l.heartbeat(&lease, LEASE_MS)).await,
                    c,
                    "stale heartbeat",
                );
                assert_stale(
                    retry_busy(&busy, || l.begin_step(&lease, ordinal, LEASE_MS)).await,
                    c,
                    "stale begin",
                );
                assert_stale(
                    retry_busy(&busy, || l.complete_step(&lease, ordinal, &ev, &tr, LEASE_MS)).await,
                    c,
                    "stale complete",
                );
                assert_stale(
                    retry_busy(&busy, || l.fail(&lease, Some(ordinal), "stale")).await,
                    c,
                    "stale fail",
                );
                assert_stale(retry_busy(&busy, || l.finish(&lease)).await, c, "stale finish");
                refused += 5;
                rounds.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
            refused
        })
    };
    let fresh_task = {
        let (done, rounds, current, busy, start) = (
            done.clone(),
            rounds.clone(),
            current.clone(),
            busy.clone(),
            start.clone(),
        );
        let lease = new.lease.clone();
        tokio::spawn(async move {
            start.wait().await;
            let l = &new_handle;
            for ordinal in 2..=STEPS {
                current.store(ordinal, Ordering::SeqCst);
                let seen = rounds.load(Ordering::SeqCst);
                retry_busy(&busy, || l.heartbeat(&lease, LEASE_MS))
                    .await
                    .expect("fresh heartbeat");
                retry_busy(&busy, || l.begin_step(&lease, ordinal, LEASE_MS))
                    .await
                    .expect("fresh begin");
                stale_round_after(&rounds, seen).await;
                let seen = rounds.load(Ordering::SeqCst);
                let (ev, tr) = (evidence("fresh", ordinal), target(ordinal));
                retry_busy(&busy, || l.complete_step(&lease, ordinal, &ev, &tr, LEASE_MS))
                    .await
                    .expect("fresh complete");
                stale_round_after(&rounds, seen).await;
            }
            retry_busy(&busy, || l.finish(&lease)).await.expect("fresh finish");
            done.store(true, Ordering::SeqCst);
        })
    };
    let fresh = fresh_task.await;
    // Stop the stale holder even if the new one failed, so the test ends.
    done.store(true, Ordering::SeqCst);
    let refused = stale_task.await.expect("the stale holder's task panicked");
    fresh.expect("the new holder's task panicked");
    eprintln!(
        "stale writes refused: {refused}; busy retries: {}",
        busy.load(Ordering::Relaxed)
    );
    let min = 2 * (STEPS - 1) * 5;
    assert!(
        refused >= min,
        "only {refused} stale writes were tried, expected at least {min}"
    );

    let rec = record(l, &old.lease.attempt_id).await;
    assert_eq!(rec.attempt.status, AttemptStatus::Succeeded);
    assert_eq!(rec.command.status, CommandStatus::Delivered);
    assert_eq!(rec.command.delivery_count, 2);
    assert_eq!(rec.command.lease_owner.as_deref(), Some("fresh"));
    assert_eq!(
        rec.receipts[0].evidence.as_deref(),
        Some(canonical_json(&evidence("stale", 1)).as_str())
    );
    for r in &rec.receipts[1..] {
        assert_eq!(r.status, ReceiptStatus::Succeeded);
        assert_eq!(
            r.evidence.as_deref(),
            Some(canonical_json(&evidence("fresh", r.ordinal)).as_str())
        );
    }
    assert_every_write_is_stale(l, &old.lease, 2).await;
    assert_every_write_is_stale(l, &new.lease, 2).await;
    assert_eq!(record(l, &old.lease.attempt_id).await, rec);
}

// ---------------------------------------------------------------------------------
// Fused transitions

/// Claim-and-begin leases the command and begins the first unfinished step in one
/// go; after a resume takeover that is the ambiguous step, with its key.
pub async fn claim_and_begin_begins_each_claimed_attempts_next_step<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "fused", "resume", 3).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let mut claimed = l.claim_and_begin("a", 10, LEASE_MS).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let c = claimed.remove(0);
    let stored = record(l, &c.lease.attempt_id).await;
    assert_eq!(c.record, stored, "the claim answers the record as written");
    assert_eq!(stored.command.status, CommandStatus::Processing);
    assert_eq!(stored.attempt.status, AttemptStatus::Running);
    assert_eq!(stored.receipts[0].status, ReceiptStatus::Running);
    assert_eq!(stored.receipts[0].started_at, Some(h.now()));
    assert!(stored.receipts[1..].iter().all(|r| r.status == ReceiptStatus::Pending));

    // Step 1 succeeds and step 2 begins; the worker dies; another takes over.
    let next = l
        .complete_and_continue(&c.lease, 1, &evidence("a", 1), &target(1), LEASE_MS)
        .await
        .unwrap();
    assert_eq!(next, Continued::Began(2));
    h.advance_ms(LEASE_MS + 1);
    let mut taken = l.claim_and_begin("b", 10, LEASE_MS).await.unwrap();
    assert_eq!(taken.len(), 1);
    let t = taken.remove(0);
    let after = record(l, &t.lease.attempt_id).await;
    assert_eq!(after.command.delivery_count, 2);
    assert_eq!(
        after.receipts[0].status,
        ReceiptStatus::Succeeded,
        "the finished step is kept"
    );
    assert_eq!(
        after.receipts[0].evidence.as_deref(),
        Some(canonical_json(&evidence("a", 1)).as_str())
    );
    assert_eq!(after.receipts[1].status, ReceiptStatus::Running);
    assert_eq!(after.receipts[1].idempotency_key, stored.receipts[1].idempotency_key);
    assert_every_write_is_stale(l, &c.lease, 2).await;
}

/// Complete-and-continue begins the next step after each completion and finishes
/// the attempt after the last: a three-step attempt takes four fenced writes.
pub async fn complete_and_continue_delivers_n_steps_in_n_plus_one_transitions<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "fused", "replay", 3).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = l.claim_and_begin("w", 1, LEASE_MS).await.unwrap().remove(0);
    for ordinal in 1..=3u32 {
        h.advance_ms(100);
        let next = l
            .complete_and_continue(&c.lease, ordinal, &evidence("w", ordinal), &target(ordinal), LEASE_MS)
            .await
            .unwrap();
        let now = record(l, &c.lease.attempt_id).await;
        let r = now.receipt(ordinal).unwrap();
        assert_eq!(r.status, ReceiptStatus::Succeeded);
        assert_eq!(
            r.evidence.as_deref(),
            Some(canonical_json(&evidence("w", ordinal)).as_str())
        );
        if ordinal < 3 {
            assert_eq!(next, Continued::Began(ordinal + 1));
            assert_eq!(now.receipt(ordinal + 1).unwrap().status, ReceiptStatus::Running);
            assert_eq!(now.command.lease_until, Some(h.now().plus_ms(LEASE_MS)));
        } else {
            assert_eq!(next, Continued::Finished);
            assert_eq!(now.attempt.status, AttemptStatus::Succeeded);
            assert_eq!(now.command.status, CommandStatus::Delivered);
            assert_eq!(now.command.lease_token, None);
        }
    }
    assert_eq!(l.open_attempts().await.unwrap(), 0);
}

/// The fused writes are fenced like the ones they chain.
pub async fn fused_writes_with_a_stale_token_are_refused_and_change_nothing<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let plan = register(l, "fused", "resume", 2).await;
    l.enqueue(&plan, Action::Execute).await.unwrap();
    let c = l.claim_and_begin("w", 1, LEASE_MS).await.unwrap().remove(0);
    let before = record(l, &c.lease.attempt_id).await;
    let forged = Lease {
        token: LeaseToken::new("not-the-token"),
        ..c.lease.clone()
    };
    assert_stale(
        l.complete_and_continue(&forged, 1, &evidence("x", 1), &target(1), LEASE_MS)
            .await,
        &c.lease.command_id,
        "complete_and_continue",
    );
    assert_eq!(record(l, &c.lease.attempt_id).await, before);
    assert!(
        l.claim_and_begin("thief", 5, LEASE_MS).await.unwrap().is_empty(),
        "a live lease is never taken"
    );
}

/// `worker_then_claim`: the ending write is applied, then the next command is
/// claimed and begun for the same owner; a refused write claims nothing and changes
/// nothing; a claim that finds nothing leaves the write standing.
pub async fn the_write_that_ends_an_attempt_claims_the_next_and_a_refused_one_claims_nothing<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let first = register(l, "ends-first", "resume", 1).await;
    let second = register(l, "ends-second", "resume", 1).await;
    let a = l.enqueue(&first, Action::Execute).await.unwrap();
    h.advance_ms(10);
    let b = l.enqueue(&second, Action::Execute).await.unwrap();
    let c = l.claim_and_begin("w", 1, LEASE_MS).await.unwrap().remove(0);
    // A claim may take either (the MySQL ledger spreads its claimers): the other waits.
    let queued = if c.lease.attempt_id == a.attempt.id { b } else { a };
    let claim = ClaimRequest {
        owner: "w".into(),
        batch: 1,
        lease_ms: LEASE_MS,
        begin: true,
        capabilities: None,
    };
    let complete = WorkerRequest::CompleteAndContinue {
        ordinal: 1,
        evidence: evidence("w", 1),
        target_receipt: target(1),
        lease_ms: LEASE_MS,
    };

    // A forged token: refused, nothing written, nothing claimed.
    let forged = Lease {
        token: LeaseToken::new("not-the-token"),
        ..c.lease.clone()
    };
    let before = record(l, &c.lease.attempt_id).await;
    assert_stale(
        l.worker_then_claim(&forged, complete.clone(), claim.clone()).await,
        &c.lease.command_id,
        "worker_then_claim",
    );
    assert_eq!(record(l, &c.lease.attempt_id).await, before);
    assert_eq!(
        record(l, &queued.attempt.id).await,
        queued,
        "a refused write claims nothing"
    );

    // The real lease: the attempt ends and the next one is claimed and begun.
    h.advance_ms(100);
    let (reply, claimed) = l.worker_then_claim(&c.lease, complete, claim.clone()).await.unwrap();
    assert_eq!(reply, Reply::Continued(Continued::Finished));
    let ended = record(l, &c.lease.attempt_id).await;
    assert_eq!(ended.attempt.status, AttemptStatus::Succeeded);
    assert_eq!(ended.command.status, CommandStatus::Delivered);
    assert_eq!(claimed.len(), 1);
    let next = &claimed[0];
    assert_eq!(next.lease.attempt_id, queued.attempt.id);
    assert_eq!(
        next.record,
        record(l, &queued.attempt.id).await,
        "the claim answers the rows it wrote"
    );
    assert_eq!(next.record.command.status, CommandStatus::Processing);
    assert_eq!(next.record.command.lease_owner.as_deref(), Some("w"));
    assert_eq!(next.record.command.lease_until, Some(h.now().plus_ms(LEASE_MS)));
    assert_eq!(next.record.receipt(1).unwrap().status, ReceiptStatus::Running);

    // Nothing left to claim: the write stands, the claim is empty.
    let complete = WorkerRequest::CompleteAndContinue {
        ordinal: 1,
        evidence: evidence("w", 1),
        target_receipt: target(1),
        lease_ms: LEASE_MS,
    };
    let (reply, claimed) = l.worker_then_claim(&next.lease, complete, claim).await.unwrap();
    assert_eq!(reply, Reply::Continued(Continued::Finished));
    assert!(claimed.is_empty(), "{claimed:?}");
    let ended = record(l, &queued.attempt.id).await;
    assert_eq!(ended.command.status, CommandStatus::Delivered);
    assert_eq!(l.open_attempts().await.unwrap(), 0);
}
