//! The driver's retry deadlines, exactly: after a ledger transport error and after a
//! transient executor failure, the retry is due at the documented backoff, which
//! grows by doubling up to its cap.
//!
//! With a 60 s lease, heartbeats are due every 20 s. A ledger retry waits twice the
//! last wait (starting from a sixteenth of the heartbeat interval, so 2.5 s first),
//! capped at the heartbeat interval; an executor retry waits a quarter of the
//! heartbeat interval, doubled after each further failure.

mod common;

use leasehold_engine::driver::{Deadline, DeadlineReason, Driver, DriverAction, ExecutorResult};
use leasehold_engine::{Failure, Reply, Timestamp, WorkerRequest};

const LEASE_MS: u64 = 60_000;

fn t(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

/// A driver for a two-step attempt whose claim began nothing, claimed at 0.
fn driver() -> Driver {
    let plan = common::plan(leasehold_engine::Recovery::Resume, &["one", "two"]);
    Driver::fused(&common::claimed(&plan), LEASE_MS, t(0))
}

fn begin(ordinal: u32) -> Option<DriverAction> {
    Some(DriverAction::Ledger(WorkerRequest::BeginStep {
        ordinal,
        lease_ms: LEASE_MS,
    }))
}

fn deadline(d: &Driver) -> Deadline {
    d.poll_timeout().expect("a running driver has a deadline")
}

#[test]
fn a_ledger_error_is_retried_after_the_first_backoff_then_twice_as_long_up_to_the_heartbeat_interval() {
    let mut d = driver();
    assert_eq!(d.poll_action(t(0)), begin(1));
    d.handle_failure(t(10), Failure::Unavailable);
    assert_eq!(
        deadline(&d),
        Deadline {
            at: t(10 + 2_500),
            reason: DeadlineReason::RetryLedger
        }
    );
    let mut now = 10 + 2_500;
    let mut expected_wait = 2_500;
    for _ in 0..4 {
        d.handle_timeout(t(now));
        assert_eq!(d.poll_action(t(now)), begin(1));
        d.handle_failure(t(now), Failure::Unavailable);
        expected_wait = (expected_wait * 2).min(20_000);
        let next = deadline(&d);
        // The heartbeat (due 20 s after the claim) may come first once the wait grows.
        if next.reason == DeadlineReason::RetryLedger {
            assert_eq!(next.at, t(now + expected_wait));
        } else {
            assert_eq!(next.reason, DeadlineReason::Heartbeat);
            assert!(now + expected_wait >= 20_000);
        }
        now += expected_wait;
    }
}

#[test]
fn a_transient_executor_failure_is_retried_after_a_quarter_of_the_heartbeat_interval_then_doubled() {
    let mut d = driver();
    assert_eq!(d.poll_action(t(0)), begin(1));
    d.handle_reply(t(5), Reply::Applied);
    assert_eq!(d.poll_action(t(5)), Some(DriverAction::Execute { ordinal: 1 }));
    d.handle_executed(t(100), 1, ExecutorResult::Transient("busy".into()));
    assert_eq!(
        deadline(&d),
        Deadline {
            at: t(100 + 5_000),
            reason: DeadlineReason::RetryExecutor
        }
    );
    assert_eq!(d.poll_action(t(100)), None, "nothing to do before the retry is due");
    d.handle_timeout(t(5_100));
    assert_eq!(d.poll_action(t(5_100)), Some(DriverAction::Execute { ordinal: 1 }));
    d.handle_executed(t(5_200), 1, ExecutorResult::Transient("busy".into()));
    assert_eq!(
        deadline(&d),
        Deadline {
            at: t(5_200 + 10_000),
            reason: DeadlineReason::RetryExecutor
        }
    );
}
