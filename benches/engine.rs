//! The engine alone (sans-IO, no storage): transitions per second, the ceiling of
//! every ledger.
//!
//! Each iteration delivers one attempt on an in-memory [`AttemptRecord`]: every
//! transition decides on the record and its writes are applied to it
//! ([`Writes::apply_to`], the reference interpreter). `one-step/separate` is claim,
//! begin, complete, finish (4 transitions); `one-step/fused` is claim-and-begin then
//! complete-and-continue (2 transactions, the same 4 transitions); `six-step/fused`
//! is claim-and-begin then six complete-and-continues (7 transactions, 13
//! transitions). Throughput is in transitions. The record's clone is setup, untimed.

use criterion::{BatchSize, Criterion, Throughput};
use leasehold::executor::Executors;
use leasehold_engine::transition::{self, NewIds};
use leasehold_engine::{Action, AttemptId, AttemptRecord, CommandId, LeaseToken, Plan, PlanId, Timestamp};
use serde_json::json;
use std::hint::black_box;
use std::time::Duration;

const LEASE_MS: u64 = 60_000;

fn queued(steps: u32) -> (Plan, AttemptRecord) {
    let now = Timestamp::from_millis(1_700_000_000_000);
    let plan = leasehold::bench::plan_spec("engine".into(), steps)
        .into_plan(&Executors::new().names(), PlanId::new("pln-1"), now)
        .expect("a valid plan");
    let ids = NewIds {
        attempt: AttemptId::new("att-1"),
        command: CommandId::new("cmd-1"),
        trace: None,
    };
    let record = transition::enqueue(&plan, &[], Action::Execute, ids, now).expect("enqueue");
    (plan, record)
}

fn one_step_separate(plan: &Plan, record: &mut AttemptRecord, now: Timestamp) {
    let token = LeaseToken::new("0123456789abcdef0123456789abcdef");
    let evidence = json!({"executor": "dry-run:v1", "step": "step-1"});
    let receipt = json!({"dry_run": "ik"});
    transition::claim(record, plan.recovery, "w", token.clone(), LEASE_MS, now)
        .expect("claim")
        .apply_to(record);
    transition::begin_step(record, 1, &token, LEASE_MS, now)
        .expect("begin")
        .apply_to(record);
    transition::complete_step(record, 1, &evidence, &receipt, &token, LEASE_MS, now)
        .expect("complete")
        .apply_to(record);
    transition::finish(record, &token, now)
        .expect("finish")
        .apply_to(record);
}

fn fused(plan: &Plan, record: &mut AttemptRecord, steps: u32, now: Timestamp) {
    let token = LeaseToken::new("0123456789abcdef0123456789abcdef");
    let evidence = json!({"executor": "dry-run:v1", "step": "step"});
    let receipt = json!({"dry_run": "ik"});
    transition::claim_and_begin(record, plan.recovery, "w", token.clone(), LEASE_MS, now)
        .expect("claim and begin")
        .apply_to(record);
    for ordinal in 1..=steps {
        let (_, writes) =
            transition::complete_and_continue(record, ordinal, &evidence, &receipt, &token, LEASE_MS, now)
                .expect("complete and continue");
        writes.apply_to(record);
    }
}

fn engine(c: &mut Criterion) {
    let now = Timestamp::from_millis(1_700_000_000_100);
    let mut g = c.benchmark_group("engine");
    let (plan1, record1) = queued(1);
    g.throughput(Throughput::Elements(4));
    g.bench_function("one-step/separate", |b| {
        b.iter_batched_ref(
            || record1.clone(),
            |r| one_step_separate(black_box(&plan1), r, now),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("one-step/fused", |b| {
        b.iter_batched_ref(
            || record1.clone(),
            |r| fused(black_box(&plan1), r, 1, now),
            BatchSize::SmallInput,
        )
    });
    let (plan6, record6) = queued(6);
    g.throughput(Throughput::Elements(13));
    g.bench_function("six-step/fused", |b| {
        b.iter_batched_ref(
            || record6.clone(),
            |r| fused(black_box(&plan6), r, 6, now),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .without_plots()
        .configure_from_args();
    engine(&mut c);
    c.final_summary();
}
