//! Retention on every ledger: a prune deletes old ended attempts with their rows, in
//! batches, and keeps what the release gate and the enqueue guards read (open
//! attempts, the latest forward attempt and everything above it, the gate's
//! baseline, the latest successful attempts), so that the gate's report and the
//! next attempt's number are the same after it as before.

use super::{deliver, fail_at, register, Harness};
use leasehold::engine::gate::{gate, GateReport, Verdict};
use leasehold::engine::{Action, AttemptId, AttemptRecord, AttemptStatus, Plan, PlanId, Timestamp};
use leasehold::ledger::prune::{prune, BatchSink, PruneOptions};
use leasehold::ledger::{Ledger, LedgerError};

const DAY_MS: u64 = 86_400_000;
const OWNER: &str = "w";

/// Every batch a prune handed over, in order.
#[derive(Default)]
struct Batches(Vec<Vec<AttemptId>>);

impl BatchSink for Batches {
    fn record(&mut self, _plan: &Plan, batch: &[AttemptRecord]) -> Result<(), LedgerError> {
        self.0.push(batch.iter().map(|r| r.attempt.id.clone()).collect());
        Ok(())
    }
}

fn options(cutoff: Timestamp, states: &[AttemptStatus], batch: u32, dry_run: bool) -> PruneOptions {
    PruneOptions {
        cutoff,
        states: states.to_vec(),
        batch,
        dry_run,
        rest_percent: 0,
    }
}

/// The numbers of a plan's attempts, in order.
async fn numbers<L: Ledger>(l: &L, plan: &PlanId) -> Vec<u32> {
    let history = l.history(plan).await.expect("history");
    history.iter().map(|r| r.attempt.number).collect()
}

async fn gate_of<L: Ledger>(l: &L, plan: &PlanId) -> GateReport {
    let p = l.plan(plan).await.expect("plan");
    gate(&p, &l.history(plan).await.expect("history"))
}

/// Enqueues `action` on `plan` and then delivers it (`ok`) or fails it at step 1.
async fn run<L: Ledger>(l: &L, plan: &PlanId, action: Action, ok: bool) {
    l.enqueue(plan, action).await.expect("enqueue");
    if ok {
        deliver(l, OWNER).await;
    } else {
        fail_at(l, OWNER, 1).await;
    }
}

pub async fn retention_keeps_open_baseline_and_latest_successful_attempts_and_prunes_the_rest_in_batches<L: Ledger>(
    h: Harness<L>,
) {
    let l = &h.ledger;
    let a = register(l, "kept-a", "resume", 1).await;
    // #1 S, #2 F, #3 retry S, #4 S (the baseline), #5 F, #6 retry S (the latest).
    for (action, ok) in [
        (Action::Execute, true),
        (Action::Execute, false),
        (Action::Retry, true),
        (Action::Execute, true),
        (Action::Execute, false),
        (Action::Retry, true),
    ] {
        run(l, &a, action, ok).await;
        h.advance_ms(1);
    }
    let b = register(l, "kept-b", "resume", 1).await;
    // #1 S, #2 F, #3 S (the baseline), #4 QUEUED (open, the latest).
    for ok in [true, false, true] {
        run(l, &b, Action::Execute, ok).await;
    }
    l.enqueue(&b, Action::Execute).await.expect("enqueue the open attempt");
    let gate_a = gate_of(l, &a).await;
    assert_eq!(gate_a.verdict, Verdict::Pass, "{gate_a:?}");
    let gate_b = gate_of(l, &b).await;
    h.advance_ms(10 * DAY_MS);
    let cutoff = Timestamp::from_millis(h.now().as_millis() - DAY_MS as i64);

    let mut batches = Batches::default();
    let pruned = prune(l, &options(cutoff, &[], 2, false), Some(&mut batches))
        .await
        .expect("prune");
    assert_eq!(pruned, 6, "a's #1, #2, #3, #5 and b's #1, #2");
    assert!(
        batches.0.iter().all(|b| !b.is_empty() && b.len() <= 2),
        "{:?}",
        batches.0
    );
    assert_eq!(batches.0.iter().map(Vec::len).sum::<usize>(), 6);
    assert_eq!(numbers(l, &a).await, [4, 6]);
    assert_eq!(numbers(l, &b).await, [3, 4]);
    for id in batches.0.iter().flatten() {
        assert!(
            matches!(l.attempt(id).await, Err(LedgerError::NotFound { .. })),
            "{id} was pruned, yet it is still there"
        );
    }
    assert_eq!(gate_of(l, &a).await, gate_a, "the gate of a changed");
    assert_eq!(gate_of(l, &b).await, gate_b, "the gate of b changed");
    assert_eq!(prune(l, &options(cutoff, &[], 2, false), None).await.expect("again"), 0);

    // Numbers stay unique and increasing: the next attempt follows the highest kept.
    deliver(l, OWNER).await;
    assert_eq!(numbers(l, &b).await, [3, 4]);
    let next = l.enqueue(&a, Action::Execute).await.expect("enqueue after prune");
    assert_eq!(next.attempt.number, 7);
    deliver(l, OWNER).await;
    assert_eq!(gate_of(l, &a).await.verdict, Verdict::Pass);
}

pub async fn retention_respects_the_cutoff_and_the_states_and_a_dry_run_deletes_nothing<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let p = register(l, "aged", "resume", 2).await;
    // Old: #1 F, #2 S, #3 F, #4 S (the baseline). Recent: #5 F, #6 S (the latest).
    for ok in [false, true, false, true] {
        run(l, &p, Action::Execute, ok).await;
    }
    h.advance_ms(10 * DAY_MS);
    for ok in [false, true] {
        run(l, &p, Action::Execute, ok).await;
    }
    let cutoff = Timestamp::from_millis(h.now().as_millis() - DAY_MS as i64);
    let everything = Timestamp::from_millis(h.now().as_millis() + 1);
    let count = |cutoff, states: &'static [AttemptStatus]| async move {
        prune(l, &options(cutoff, states, 1, true), None)
            .await
            .expect("dry run")
    };
    assert_eq!(count(everything, &[]).await, 4, "#1, #2, #3 and #5");
    assert_eq!(count(cutoff, &[]).await, 3, "#1, #2 and #3 ended before the cutoff");
    assert_eq!(count(cutoff, &[AttemptStatus::Failed]).await, 2, "#1 and #3");
    assert_eq!(count(cutoff, &[AttemptStatus::Aborted]).await, 0);
    assert_eq!(numbers(l, &p).await, [1, 2, 3, 4, 5, 6], "a dry run deletes nothing");
    let refused = prune(l, &options(cutoff, &[AttemptStatus::Running], 1, true), None).await;
    assert!(matches!(refused, Err(LedgerError::BadInput(_))), "{refused:?}");

    let mut batches = Batches::default();
    let failed = options(cutoff, &[AttemptStatus::Failed], 500, false);
    assert_eq!(prune(l, &failed, Some(&mut batches)).await.expect("prune"), 2);
    assert_eq!(batches.0.len(), 1, "one batch of two");
    assert_eq!(numbers(l, &p).await, [2, 4, 5, 6]);
    assert_eq!(
        prune(l, &options(cutoff, &[], 500, false), None).await.expect("prune"),
        1
    );
    assert_eq!(numbers(l, &p).await, [4, 5, 6]);
    assert_eq!(gate_of(l, &p).await.verdict, Verdict::Pass);
}

pub async fn retention_keeps_a_compensation_and_the_guards_decide_as_before<L: Ledger>(h: Harness<L>) {
    let l = &h.ledger;
    let p = register(l, "undone", "resume", 1).await;
    // #1 F, #2 retry S (the baseline), #3 S (the latest forward), #4 compensate S.
    run(l, &p, Action::Execute, false).await;
    run(l, &p, Action::Retry, true).await;
    run(l, &p, Action::Execute, true).await;
    run(l, &p, Action::Compensate, true).await;
    let before = gate_of(l, &p).await;
    assert_eq!(before.verdict, Verdict::Block, "a compensated delivery blocks");
    h.advance_ms(10 * DAY_MS);
    let cutoff = Timestamp::from_millis(h.now().as_millis() - DAY_MS as i64);
    assert_eq!(
        prune(l, &options(cutoff, &[], 500, false), None).await.expect("prune"),
        1
    );
    assert_eq!(numbers(l, &p).await, [2, 3, 4]);
    assert_eq!(gate_of(l, &p).await, before, "the gate changed");
    let again = l.enqueue(&p, Action::Compensate).await;
    assert!(
        matches!(&again, Err(LedgerError::Refused(r)) if r.to_string().contains("already compensated")),
        "{again:?}"
    );
    let retry = l.enqueue(&p, Action::Retry).await;
    assert!(
        matches!(retry, Err(LedgerError::Refused(_))),
        "the latest is SUCCEEDED: {retry:?}"
    );
    let next = l.enqueue(&p, Action::Execute).await.expect("enqueue");
    assert_eq!(next.attempt.number, 5);
}
