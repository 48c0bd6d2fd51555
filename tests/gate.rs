//! The release gate and the comparison of attempts, end to end.
//!
//! - Snapshot cases: each gate verdict (first baseline PASS, PASS against a
//!   baseline, and BLOCK for every cause) and each comparison outcome is built from
//!   a memory ledger on a fixed clock and seed (or, where no ledger can produce the
//!   state, from hand-edited records), asserted on, and rendered as text and JSON
//!   into reviewed insta snapshots under `snapshots/`.
//! - The rehearsal plan delivered twice by the real worker and executors has two raw
//!   fingerprints and one semantic fingerprint, and passes; a third delivery whose
//!   evidence differs in one non-volatile field blocks, naming that field.
//! - Evidence edited behind leasehold's back in the SQLite file blocks the gate,
//!   naming the receipt.
//! - No report ever contains a lease token or a database URL.

#[path = "gate/support.rs"]
mod support;

use leasehold::clock::{Clock, SystemClock};
use leasehold::entropy::{Entropy, SeededEntropy};
use leasehold::executor::{ExecRequest, Executor, ExecutorResult, Executors};
use leasehold::ledger::memory::MemoryLedger;
use leasehold::ledger::sqlite::SqliteLedger;
use leasehold::ledger::Ledger;
use leasehold::report::{comparison_json, comparison_text, gate_exit_code, gate_json, gate_text, GATE_BLOCK_EXIT_CODE};
use leasehold::worker::{RunOptions, Worker};
use leasehold_engine::canonical::canonical_json;
use leasehold_engine::evidence::{compare, latest_successful_pair, Comparison, ComparisonVerdict};
use leasehold_engine::gate::{gate, CheckName, GateReport, Verdict};
use leasehold_engine::lease::WorkerConfig;
use leasehold_engine::{AttemptId, CommandStatus, Plan, PlanSpec};
use serde_json::{json, Value};
use std::sync::Arc;
use support::{demo_evidence, drifted_evidence, Fixture, DRIFTED_PATH, SEED};

/// One rendered case: its report in text and JSON, and every token minted for it.
struct Case {
    name: &'static str,
    description: &'static str,
    text: String,
    json: String,
    tokens: Vec<String>,
}

impl Case {
    fn gate<L>(name: &'static str, description: &'static str, fx: &Fixture<L>, plan: &Plan, report: &GateReport) -> Self
    where
        L: Ledger,
    {
        Self {
            name,
            description,
            text: gate_text(report, plan),
            json: pretty(&gate_json(report, plan)),
            tokens: fx.tokens(),
        }
    }

    fn comparison<L: Ledger>(
        name: &'static str,
        description: &'static str,
        fx: &Fixture<L>,
        plan: &Plan,
        c: &Comparison,
    ) -> Self {
        Self {
            name,
            description,
            text: comparison_text(c, plan),
            json: pretty(&comparison_json(c, plan)),
            tokens: fx.tokens(),
        }
    }

    /// Checks both renderings against `snapshots/<name>_text.snap` and `…_json.snap`.
    fn assert_snapshots(&self) {
        insta::with_settings!({
            snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"),
            prepend_module_to_snapshot => false,
            description => self.description,
            omit_expression => true,
        }, {
            insta::assert_snapshot!(format!("{}_text", self.name), self.text);
            insta::assert_snapshot!(format!("{}_json", self.name), self.json);
        });
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).expect("a JSON value always renders")
}

fn verdicts(r: &GateReport) -> Vec<&'static str> {
    r.checks.iter().map(|c| c.verdict.as_str()).collect()
}

fn reason(r: &GateReport, name: CheckName) -> &str {
    &r.check(name).expect("every check is reported").reason
}

// ---------------------------------------------------------------------------------
// The snapshot cases.

async fn first_baseline_pass() -> Case {
    let fx = Fixture::memory().await;
    fx.deliver(demo_evidence).await;
    let plan = fx.plan().await;
    let r = gate(&plan, &fx.history().await);
    assert_eq!(r.verdict, Verdict::Pass, "{r:#?}");
    assert_eq!(gate_exit_code(&r), 0);
    assert!(r.baseline.is_none());
    assert!(reason(&r, CheckName::MatchesBaseline).ends_with("it sets the baseline"));
    Case::gate(
        "gate_first_baseline_pass",
        "the first delivered attempt sets the baseline",
        &fx,
        &plan,
        &r,
    )
}

async fn pass_against_baseline() -> Case {
    let fx = Fixture::memory().await;
    let first = fx.deliver(demo_evidence).await;
    fx.deliver(demo_evidence).await;
    let plan = fx.plan().await;
    let r = gate(&plan, &fx.history().await);
    assert_eq!(r.verdict, Verdict::Pass, "{r:#?}");
    assert_eq!(r.baseline.as_ref().map(|b| &b.attempt_id), Some(&first));
    assert_eq!(r.semantic_fingerprint, r.baseline_semantic_fingerprint);
    Case::gate(
        "gate_pass_against_baseline",
        "a second delivery differing only in volatile identity passes against the first",
        &fx,
        &plan,
        &r,
    )
}

async fn block_no_attempt() -> Case {
    let fx = Fixture::memory().await;
    let plan = fx.plan().await;
    let r = gate(&plan, &fx.history().await);
    assert_eq!(verdicts(&r), ["PASS", "BLOCK", "BLOCK", "BLOCK", "BLOCK"]);
    assert_eq!(gate_exit_code(&r), GATE_BLOCK_EXIT_CODE);
    assert!(r.latest.is_none() && r.raw_fingerprint.is_none());
    Case::gate(
        "gate_block_no_attempt",
        "a plan with no attempt is blocked",
        &fx,
        &plan,
        &r,
    )
}

async fn block_latest_running() -> Case {
    let fx = Fixture::memory().await;
    fx.deliver(demo_evidence).await;
    let (lease, record) = fx.start().await;
    let evidence = demo_evidence(&lease.attempt_id);
    fx.step(&lease, &record, 1, &evidence[0]).await;
    fx.begin(&lease, 2).await;
    let plan = fx.plan().await;
    let r = gate(&plan, &fx.history().await);
    assert_eq!(verdicts(&r), ["PASS", "BLOCK", "BLOCK", "BLOCK", "BLOCK"]);
    assert!(reason(&r, CheckName::LatestSucceeded).ends_with("is RUNNING, not SUCCEEDED"));
    assert!(reason(&r, CheckName::EvidenceIntact)
        .ends_with("receipt 2 (seed-accounts) is RUNNING, receipt 3 (notify) is PENDING"));
    Case::gate(
        "gate_block_latest_running",
        "a newer attempt still RUNNING blocks even though an earlier one was delivered",
        &fx,
        &plan,
        &r,
    )
}

async fn block_latest_failed() -> Case {
    let fx = Fixture::memory().await;
    fx.deliver(demo_evidence).await;
    let (lease, record) = fx.start().await;
    let evidence = demo_evidence(&lease.attempt_id);
    fx.step(&lease, &record, 1, &evidence[0]).await;
    fx.begin(&lease, 2).await;
    fx.ledger
        .fail(&lease, Some(2), "step seed-accounts: statement sql[0] failed")
        .await
        .expect("fail is admitted");
    let plan = fx.plan().await;
    let r = gate(&plan, &fx.history().await);
    assert_eq!(verdicts(&r), ["PASS", "BLOCK", "BLOCK", "BLOCK", "BLOCK"]);
    assert!(reason(&r, CheckName::LatestSucceeded).ends_with("is FAILED, not SUCCEEDED"));
    assert!(reason(&r, CheckName::CommandDelivered).ends_with("is FAILED, not DELIVERED"));
    Case::gate(
        "gate_block_latest_failed",
        "a newer FAILED attempt blocks",
        &fx,
        &plan,
        &r,
    )
}

async fn block_latest_aborted() -> Case {
    let fx = Fixture::memory().await;
    fx.deliver(demo_evidence).await;
    let (lease, record) = fx.start().await;
    let evidence = demo_evidence(&lease.attempt_id);
    fx.step(&lease, &record, 1, &evidence[0]).await;
    fx.ledger
        .abort(&lease.attempt_id, "operator stopped the rehearsal")
        .await
        .expect("abort is admitted");
    let plan = fx.plan().await;
    let r = gate(&plan, &fx.history().await);
    assert_eq!(verdicts(&r), ["PASS", "BLOCK", "BLOCK", "BLOCK", "BLOCK"]);
    assert!(reason(&r, CheckName::LatestSucceeded).ends_with("is ABORTED, not SUCCEEDED"));
    Case::gate(
        "gate_block_latest_aborted",
        "a newer ABORTED attempt blocks",
        &fx,
        &plan,
        &r,
    )
}

async fn block_command_not_delivered() -> Case {
    let fx = Fixture::memory().await;
    fx.deliver(demo_evidence).await;
    fx.deliver(demo_evidence).await;
    let plan = fx.plan().await;
    // No ledger leaves a SUCCEEDED attempt with an undelivered command; build one,
    // with a live lease token that the report must not show.
    let mut history = fx.history().await;
    let token = SeededEntropy::new(SEED + 1).token();
    fx.remember_token(token.expose());
    let command = &mut history[1].command;
    command.status = CommandStatus::Processing;
    command.lease_owner = Some(support::OWNER.to_owned());
    command.lease_token = Some(token);
    command.lease_until = command.finished_at.map(|t| t.plus_ms(support::LEASE_MS));
    command.finished_at = None;
    let r = gate(&plan, &history);
    assert_eq!(verdicts(&r), ["PASS", "PASS", "BLOCK", "PASS", "PASS"]);
    assert!(reason(&r, CheckName::CommandDelivered).ends_with("is PROCESSING, not DELIVERED"));
    Case::gate(
        "gate_block_command_not_delivered",
        "an attempt recorded SUCCEEDED whose command is not DELIVERED (hand-built) blocks",
        &fx,
        &plan,
        &r,
    )
}

async fn block_tampered_evidence() -> Case {
    let fx = Fixture::memory().await;
    fx.deliver(demo_evidence).await;
    let latest = fx.deliver(demo_evidence).await;
    let plan = fx.plan().await;
    // Edit the stored evidence of receipt 2 and keep its recorded SHA-256.
    let mut history = fx.history().await;
    let receipt = &mut history[1].receipts[1];
    let mut evidence: Value = serde_json::from_str(receipt.evidence.as_deref().expect("evidence")).expect("JSON");
    evidence["checks"]["accounts"][1][2] = json!("FR");
    receipt.evidence = Some(canonical_json(&evidence));
    let r = gate(&plan, &history);
    assert_eq!(verdicts(&r), ["PASS", "PASS", "PASS", "BLOCK", "BLOCK"]);
    assert_eq!(r.tampered.len(), 1);
    assert_eq!(
        (&r.tampered[0].receipt.attempt_id, r.tampered[0].receipt.ordinal),
        (&latest, 2)
    );
    assert!(reason(&r, CheckName::EvidenceIntact).contains(&format!("receipt 2 (seed-accounts) of attempt {latest}")));
    Case::gate(
        "gate_block_tampered_evidence",
        "evidence edited behind leasehold's back (recorded SHA-256 kept) blocks, naming the receipt",
        &fx,
        &plan,
        &r,
    )
}

async fn block_semantic_drift() -> Case {
    let fx = Fixture::memory().await;
    fx.deliver(demo_evidence).await;
    fx.deliver(drifted_evidence).await;
    let plan = fx.plan().await;
    let r = gate(&plan, &fx.history().await);
    assert_eq!(verdicts(&r), ["PASS", "PASS", "PASS", "PASS", "BLOCK"]);
    assert_eq!(r.drift.len(), 1);
    assert_eq!(r.drift[0].path, DRIFTED_PATH);
    assert!(reason(&r, CheckName::MatchesBaseline).ends_with(DRIFTED_PATH));
    assert_ne!(r.semantic_fingerprint, r.baseline_semantic_fingerprint);
    Case::gate(
        "gate_block_semantic_drift",
        "a delivery whose evidence differs from the baseline's in a non-volatile field blocks",
        &fx,
        &plan,
        &r,
    )
}

async fn block_plan_retired() -> Case {
    let fx = Fixture::memory().await;
    fx.deliver(demo_evidence).await;
    fx.deliver(demo_evidence).await;
    fx.ledger.retire_plan(&fx.plan.id).await.expect("retire succeeds");
    let plan = fx.plan().await;
    let r = gate(&plan, &fx.history().await);
    assert_eq!(verdicts(&r), ["BLOCK", "PASS", "PASS", "PASS", "PASS"]);
    assert!(reason(&r, CheckName::PlanReady).ends_with("is RETIRED, not READY"));
    Case::gate(
        "gate_block_plan_retired",
        "a RETIRED plan is blocked however good its attempts",
        &fx,
        &plan,
        &r,
    )
}

async fn comparison_equal() -> Case {
    let fx = Fixture::memory().await;
    fx.deliver(demo_evidence).await;
    fx.deliver(demo_evidence).await;
    let plan = fx.plan().await;
    let history = fx.history().await;
    let (left, right) = latest_successful_pair(&plan, &history).expect("two successful attempts");
    let c = compare(&plan, left, right);
    assert_eq!(c.verdict, ComparisonVerdict::Equal);
    assert!(c.differences.is_empty() && c.steps_equal && c.semantic_equal);
    assert_ne!(c.left.raw_fingerprint, c.right.raw_fingerprint);
    Case::comparison(
        "comparison_equal",
        "two deliveries that differ only in volatile identity compare EQUAL",
        &fx,
        &plan,
        &c,
    )
}

async fn comparison_drift() -> Case {
    let fx = Fixture::memory().await;
    fx.deliver(demo_evidence).await;
    fx.deliver(drifted_evidence).await;
    let plan = fx.plan().await;
    let history = fx.history().await;
    let c = compare(&plan, &history[0], &history[1]);
    assert_eq!(c.verdict, ComparisonVerdict::Drift);
    assert!(c.steps_equal && !c.semantic_equal);
    let paths: Vec<&str> = c.differences.iter().map(|d| d.path.as_str()).collect();
    assert_eq!(paths, [DRIFTED_PATH]);
    assert_eq!(c.differences[0].left, Some(json!("ada@example.com")));
    assert_eq!(c.differences[0].right, Some(json!("ada@example.org")));
    Case::comparison(
        "comparison_drift",
        "a non-volatile evidence field differs: DRIFT, naming it",
        &fx,
        &plan,
        &c,
    )
}

async fn comparison_incomparable() -> Case {
    let fx = Fixture::memory().await;
    fx.deliver(demo_evidence).await;
    let (lease, record) = fx.start().await;
    fx.step(&lease, &record, 1, &demo_evidence(&lease.attempt_id)[0]).await;
    let plan = fx.plan().await;
    let history = fx.history().await;
    let c = compare(&plan, &history[0], &history[1]);
    assert_eq!(c.verdict, ComparisonVerdict::Incomparable);
    assert!(c.problems.iter().all(|p| p.starts_with("right")), "{:?}", c.problems);
    Case::comparison(
        "comparison_incomparable",
        "a RUNNING attempt is not compared; the problems name the side",
        &fx,
        &plan,
        &c,
    )
}

async fn all_cases() -> Vec<Case> {
    vec![
        first_baseline_pass().await,
        pass_against_baseline().await,
        block_no_attempt().await,
        block_latest_running().await,
        block_latest_failed().await,
        block_latest_aborted().await,
        block_command_not_delivered().await,
        block_tampered_evidence().await,
        block_semantic_drift().await,
        block_plan_retired().await,
        comparison_equal().await,
        comparison_drift().await,
        comparison_incomparable().await,
    ]
}

#[tokio::test]
async fn the_first_delivered_attempt_sets_the_baseline_and_passes() {
    first_baseline_pass().await.assert_snapshots();
}

#[tokio::test]
async fn a_delivery_equal_to_the_baseline_passes() {
    pass_against_baseline().await.assert_snapshots();
}

#[tokio::test]
async fn a_plan_without_attempts_is_blocked() {
    block_no_attempt().await.assert_snapshots();
}

#[tokio::test]
async fn a_newer_running_attempt_blocks() {
    block_latest_running().await.assert_snapshots();
}

#[tokio::test]
async fn a_newer_failed_attempt_blocks() {
    block_latest_failed().await.assert_snapshots();
}

#[tokio::test]
async fn a_newer_aborted_attempt_blocks() {
    block_latest_aborted().await.assert_snapshots();
}

#[tokio::test]
async fn a_succeeded_attempt_with_an_undelivered_command_blocks() {
    block_command_not_delivered().await.assert_snapshots();
}

#[tokio::test]
async fn tampered_evidence_blocks_and_names_the_receipt() {
    block_tampered_evidence().await.assert_snapshots();
}

#[tokio::test]
async fn semantic_drift_blocks_and_names_the_field() {
    block_semantic_drift().await.assert_snapshots();
}

#[tokio::test]
async fn a_retired_plan_is_blocked() {
    block_plan_retired().await.assert_snapshots();
}

#[tokio::test]
async fn equal_attempts_compare_equal() {
    comparison_equal().await.assert_snapshots();
}

#[tokio::test]
async fn drifting_attempts_compare_as_drift_with_every_differing_field() {
    comparison_drift().await.assert_snapshots();
}

#[tokio::test]
async fn an_incomplete_attempt_is_not_compared() {
    comparison_incomparable().await.assert_snapshots();
}

// ---------------------------------------------------------------------------------
// No report leaks a lease token or a database URL.

/// Asserts that none of `reports` contains any of `tokens`, a database URL, or a
/// lease-token field.
fn assert_clean(what: &str, reports: &[&str], tokens: &[String]) {
    for report in reports {
        for token in tokens {
            assert!(
                !report.contains(token.as_str()),
                "{what}: a lease token appears in:\n{report}"
            );
        }
        for needle in ["sqlite://", "mysql://", "postgres://", "lease_token"] {
            assert!(!report.contains(needle), "{what}: {needle:?} appears in:\n{report}");
        }
    }
}

#[tokio::test]
async fn no_report_contains_a_lease_token_or_a_database_url() {
    let cases = all_cases().await;
    let mut tokens_seen = 0;
    for case in &cases {
        for token in &case.tokens {
            assert!(
                token.len() == 32 && token.chars().all(|c| c.is_ascii_hexdigit()),
                "{token}"
            );
        }
        tokens_seen += case.tokens.len();
        assert_clean(case.name, &[&case.text, &case.json], &case.tokens);
    }
    // Every case but "no attempt" claimed at least once, so tokens were really minted.
    assert!(tokens_seen >= cases.len() - 1, "only {tokens_seen} tokens captured");
}

// ---------------------------------------------------------------------------------
// The rehearsal plan, delivered by the real worker and executors.

fn rehearsal_spec() -> PlanSpec {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/plans/rehearsal.toml");
    let text = std::fs::read_to_string(path).expect("the rehearsal plan is readable");
    toml::from_str::<PlanSpec>(&text).expect("the rehearsal plan parses")
}

/// The step whose evidence [`Drifting`] changes, and the change's JSON pointer.
const DRIFT_STEP: &str = "seed-reference-data";
const REHEARSAL_DRIFT_PATH: &str = "/receipts/1/evidence/checks/accounts/0/1";

/// The built-in executors, except that the `seed-reference-data` step reports the
/// first account's email differently: a non-volatile evidence field.
struct Drifting(Executors);

impl Executor for Drifting {
    async fn execute(&self, request: ExecRequest) -> ExecutorResult {
        let drift = request.step.code == DRIFT_STEP;
        match self.0.execute(request).await {
            ExecutorResult::Done {
                mut evidence,
                target_receipt,
            } if drift => {
                let email = &mut evidence["checks"]["accounts"][0][1];
                assert_eq!(*email, json!("ada@example.com"), "the rehearsal's first account");
                *email = json!("ada@example.org");
                ExecutorResult::Done {
                    evidence,
                    target_receipt,
                }
            }
            other => other,
        }
    }

    fn release(&self, attempt: &AttemptId, delivery: u32) {
        self.0.release(attempt, delivery);
    }
}

async fn run_worker<L: Ledger, E: Executor>(ledger: &Arc<L>, executor: E) {
    let config = WorkerConfig::clamped(true, 20, 5, 60_000);
    let worker = Worker::new(
        "gate-rehearsal-worker",
        ledger.clone(),
        Arc::new(executor),
        Arc::new(SystemClock),
        config,
    );
    let report = worker
        .run(
            std::future::pending(),
            RunOptions {
                until_idle: true,
                grace_ms: 0,
            },
        )
        .await;
    assert_eq!((report.delivered, report.failed), (1, 0), "{report:?}");
}

#[tokio::test]
async fn rehearsal_deliveries_share_a_semantic_fingerprint_and_drift_blocks_naming_the_field() {
    let ledger = Arc::new(MemoryLedger::new(
        Arc::new(SystemClock),
        Arc::new(SeededEntropy::new(SEED)),
    ));
    let plan = ledger
        .register_plan(rehearsal_spec(), &Executors::new().names())
        .await
        .expect("the rehearsal registers");
    let enqueue = || async {
        ledger
            .enqueue(&plan.id, leasehold_engine::Action::Execute)
            .await
            .expect("enqueue is admitted");
    };

    enqueue().await;
    run_worker(&ledger, Executors::new()).await;
    enqueue().await;
    run_worker(&ledger, Executors::new()).await;
    let history = ledger.history(&plan.id).await.expect("history reads");
    let c = compare(&plan, &history[0], &history[1]);
    assert_eq!(c.verdict, ComparisonVerdict::Equal, "{}", comparison_text(&c, &plan));
    assert_ne!(
        c.left.raw_fingerprint, c.right.raw_fingerprint,
        "the sandbox ids differ"
    );
    assert_eq!(c.left.semantic_fingerprint, c.right.semantic_fingerprint);
    let r = gate(&plan, &history);
    assert!(r.passed(), "{}", gate_text(&r, &plan));
    assert_eq!(r.baseline.as_ref().map(|b| &b.attempt_id), Some(&history[0].attempt.id));

    enqueue().await;
    run_worker(&ledger, Drifting(Executors::new())).await;
    let history = ledger.history(&plan.id).await.expect("history reads");
    let r = gate(&plan, &history);
    let text = gate_text(&r, &plan);
    let json = gate_json(&r, &plan);
    assert_eq!(verdicts(&r), ["PASS", "PASS", "PASS", "PASS", "BLOCK"], "{text}");
    assert_eq!(gate_exit_code(&r), GATE_BLOCK_EXIT_CODE);
    assert_eq!(r.baseline.as_ref().map(|b| &b.attempt_id), Some(&history[1].attempt.id));
    assert!(
        reason(&r, CheckName::MatchesBaseline).contains(REHEARSAL_DRIFT_PATH),
        "{text}"
    );
    assert!(
        text.contains(REHEARSAL_DRIFT_PATH) && text.contains("\"ada@example.org\""),
        "{text}"
    );
    assert_eq!(
        json["differences"],
        json!([{
            "path": REHEARSAL_DRIFT_PATH,
            "ordinal": 2,
            "step_code": DRIFT_STEP,
            "baseline": "ada@example.com",
            "latest": "ada@example.org",
        }])
    );
    let comparison = compare(&plan, &history[1], &history[2]);
    assert_eq!(comparison.verdict, ComparisonVerdict::Drift);
    assert_clean(
        "rehearsal",
        &[
            &text,
            &pretty(&json),
            &comparison_text(&comparison, &plan),
            &pretty(&comparison_json(&comparison, &plan)),
        ],
        &[],
    );
}

// ---------------------------------------------------------------------------------
// Tamper detection on the real SQLite file.

#[tokio::test]
async fn evidence_edited_in_the_sqlite_file_blocks_the_gate_naming_the_receipt() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("leasehold.db");
    let path = path.to_str().expect("a UTF-8 path");
    let clock = support::clock();
    let ledger_clock: Arc<dyn Clock> = clock.clone();
    let ledger =
        SqliteLedger::open(path, ledger_clock, Arc::new(SeededEntropy::new(SEED))).expect("the database opens");
    ledger.migrate().await.expect("the schema migrates");
    let fx = Fixture::new(ledger, clock, support::demo_spec()).await;
    fx.deliver(demo_evidence).await;
    let latest = fx.deliver(demo_evidence).await;
    let plan = fx.plan().await;
    let before = gate(&plan, &fx.history().await);
    assert!(before.passed(), "{}", gate_text(&before, &plan));

    // Behind leasehold's back: new evidence for receipt 2, the old SHA-256 kept.
    let conn = rusqlite::Connection::open(path).expect("the file opens directly");
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .expect("busy timeout");
    let (stored, sha): (String, String) = conn
        .query_row(
            "SELECT evidence, evidence_sha256 FROM receipt WHERE attempt_id = ?1 AND ordinal = 2",
            [latest.as_str()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("receipt 2 exists");
    let mut evidence: Value = serde_json::from_str(&stored).expect("stored evidence is JSON");
    evidence["checks"]["accounts"][0][2] = json!("GB");
    let updated = conn
        .execute(
            "UPDATE receipt SET evidence = ?1 WHERE attempt_id = ?2 AND ordinal = 2",
            rusqlite::params![canonical_json(&evidence), latest.as_str()],
        )
        .expect("the update applies");
    assert_eq!(updated, 1);
    drop(conn);

    let history = fx.history().await;
    assert_eq!(
        history[1].receipts[1].evidence_sha256.as_deref(),
        Some(sha.as_str()),
        "the old SHA-256 is kept"
    );
    let r = gate(&plan, &history);
    let text = gate_text(&r, &plan);
    assert_eq!(verdicts(&r), ["PASS", "PASS", "PASS", "BLOCK", "BLOCK"], "{text}");
    assert_eq!(r.tampered.len(), 1, "{text}");
    let named = &r.tampered[0].receipt;
    assert_eq!(
        (&named.attempt_id, named.ordinal, named.step_code.as_str()),
        (&latest, 2, "seed-accounts")
    );
    let receipt = format!("receipt 2 (seed-accounts) of attempt {latest}");
    assert!(reason(&r, CheckName::EvidenceIntact).contains(&receipt), "{text}");
    let json = pretty(&gate_json(&r, &plan));
    assert!(
        json.contains(&format!("\"attempt_id\": \"{latest}\"")) && json.contains("\"ordinal\": 2"),
        "{json}"
    );
    assert_clean("sqlite tamper", &[&text, &json], &fx.tokens());
}
