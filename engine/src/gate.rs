//! The release gate: may the latest attempt of a plan be released?
//!
//! [`gate`] is a pure function of a plan and its attempt history. It is computed from
//! the durable records on every request and never stored. Five checks, always all
//! five, in this order, each with a verdict and a reason:
//!
//! 1. `plan-ready` — the plan is READY and its content still matches its fingerprint.
//! 2. `latest-succeeded` — the latest attempt exists, is SUCCEEDED, is complete (one
//!    SUCCEEDED receipt per plan step, in plan order) and has not been compensated.
//! 3. `command-delivered` — its command is DELIVERED.
//! 4. `evidence-intact` — every receipt has evidence that matches its SHA-256 and is
//!    canonical JSON ([`crate::evidence::verify_receipt`]); a failure names the
//!    receipt (attempt id, ordinal, step code).
//! 5. `matches-baseline` — its semantic fingerprint equals the baseline's. The
//!    baseline is the previous successful delivered attempt: the highest-numbered
//!    forward attempt below the latest that is SUCCEEDED with its command DELIVERED
//!    and, for a template ([`crate::input`]), ran the same input (a rehearsal of the
//!    same change). When there is none, the latest sets the baseline and the check passes. A
//!    baseline whose own evidence fails verification blocks.
//!
//! The overall verdict is PASS only if every check passes.
//!
//! **Which attempts count.** Only forward attempts (`execute`, `retry`) are
//! candidates for "latest" and for the baseline; "latest" is the highest-numbered
//! one of any status, so a newer QUEUED, RUNNING, FAILED or ABORTED attempt blocks.
//! Compensate attempts never become the latest or the baseline (their evidence is
//! undo evidence, not a delivery), but one numbered above the latest forward attempt,
//! in any status, blocks check 2: that delivery is being or has been undone. A new
//! forward attempt after the compensation is gated normally. Attempts of other plans
//! in `history` are ignored.
//!
//! Because the baseline is simply the previous successful delivered attempt, a
//! drifting attempt becomes the baseline of the next one: a change is accepted by
//! delivering it twice in a row.

use crate::evidence::{differences, raw_fingerprint, semantic_fingerprint, verify_receipts, Difference, TamperError};
use crate::ids::{AttemptId, CommandId, PlanId};
use crate::model::{Action, AttemptRecord, AttemptStatus, CommandStatus, Plan, PlanStatus, ReceiptStatus};
use crate::plan::verify_fingerprint;
use std::fmt;

/// How many differing fields a check reason names before it says "and N more".
pub const REASON_DIFFERENCES_MAX: usize = 3;

/// A verdict: PASS or BLOCK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Nothing stands in the way.
    Pass,
    /// Release is blocked.
    Block,
}

impl Verdict {
    /// `PASS` or `BLOCK`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Block => "BLOCK",
        }
    }

    fn of(pass: bool) -> Self {
        if pass {
            Self::Pass
        } else {
            Self::Block
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The five checks, in the order they are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CheckName {
    /// The plan is READY (and intact).
    PlanReady,
    /// The latest forward attempt exists, is SUCCEEDED and complete.
    LatestSucceeded,
    /// Its command is DELIVERED.
    CommandDelivered,
    /// Every receipt's evidence matches its SHA-256.
    EvidenceIntact,
    /// Its semantic fingerprint equals the baseline's.
    MatchesBaseline,
}

impl CheckName {
    /// Every check, in report order.
    pub const ALL: [CheckName; 5] = [
        Self::PlanReady,
        Self::LatestSucceeded,
        Self::CommandDelivered,
        Self::EvidenceIntact,
        Self::MatchesBaseline,
    ];

    /// The check's printed name, e.g. `plan-ready`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::PlanReady => "plan-ready",
            Self::LatestSucceeded => "latest-succeeded",
            Self::CommandDelivered => "command-delivered",
            Self::EvidenceIntact => "evidence-intact",
            Self::MatchesBaseline => "matches-baseline",
        }
    }
}

impl fmt::Display for CheckName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Which check.
    pub name: CheckName,
    /// PASS or BLOCK.
    pub verdict: Verdict,
    /// Why, in one sentence naming the rows involved.
    pub reason: String,
}

impl Check {
    fn new(name: CheckName, pass: bool, reason: String) -> Self {
        Self {
            name,
            verdict: Verdict::of(pass),
            reason,
        }
    }
}

/// An attempt as the gate names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRef {
    /// The attempt.
    pub attempt_id: AttemptId,
    /// Its number within the plan.
    pub number: u32,
    /// execute or retry.
    pub action: Action,
    /// Its status.
    pub status: AttemptStatus,
    /// Its command.
    pub command_id: CommandId,
    /// The command's status.
    pub command_status: CommandStatus,
}

impl AttemptRef {
    /// The reference of a record.
    pub fn of(record: &AttemptRecord) -> Self {
        Self {
            attempt_id: record.attempt.id.clone(),
            number: record.attempt.number,
            action: record.attempt.action,
            status: record.attempt.status,
            command_id: record.command.id.clone(),
            command_status: record.command.status,
        }
    }
}

impl fmt::Display for AttemptRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attempt {} (#{}, {})", self.attempt_id, self.number, self.action)
    }
}

/// The gate's answer for one plan.
#[derive(Debug, Clone, PartialEq)]
pub struct GateReport {
    /// The plan.
    pub plan_id: PlanId,
    /// Its name.
    pub plan_name: String,
    /// Its status.
    pub plan_status: PlanStatus,
    /// PASS only if every check passes.
    pub verdict: Verdict,
    /// The five checks, in [`CheckName::ALL`] order.
    pub checks: Vec<Check>,
    /// The latest forward attempt, if any.
    pub latest: Option<AttemptRef>,
    /// [`raw_fingerprint`] of the latest attempt.
    pub raw_fingerprint: Option<String>,
    /// [`semantic_fingerprint`] of the latest attempt.
    pub semantic_fingerprint: Option<String>,
    /// The attempt compared against (the previous successful delivered attempt);
    /// `None` when the latest sets the baseline or there is no latest.
    pub baseline: Option<AttemptRef>,
    /// [`semantic_fingerprint`] of the baseline.
    pub baseline_semantic_fingerprint: Option<String>,
    /// Receipts of the latest attempt (then of the baseline) whose evidence fails
    /// verification.
    pub tampered: Vec<TamperError>,
    /// Fields in which the latest attempt differs from the baseline (left =
    /// baseline, right = latest); empty unless check 5 compared them.
    pub drift: Vec<Difference>,
}

impl GateReport {
    /// Whether the verdict is PASS.
    pub fn passed(&self) -> bool {
        self.verdict == Verdict::Pass
    }

    /// The check with this name.
    pub fn check(&self, name: CheckName) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }
}

/// Why a forward attempt is not complete, if it is not: it must hold one SUCCEEDED
/// receipt per plan step, in plan order.
fn incomplete(plan: &Plan, record: &AttemptRecord) -> Option<String> {
    if let Some(open) = record.receipts.iter().find(|r| r.status != ReceiptStatus::Succeeded) {
        return Some(format!(
            "receipt {} ({}) is {}",
            open.ordinal, open.step_code, open.status
        ));
    }
    let mut ordered: Vec<(u32, &str)> = record
        .receipts
        .iter()
        .map(|r| (r.ordinal, r.step_code.as_str()))
        .collect();
    ordered.sort_unstable();
    let steps: Vec<&str> = ordered.iter().map(|(_, code)| *code).collect();
    let expected: Vec<&str> = plan.steps.iter().map(|s| s.code.as_str()).collect();
    if steps != expected {
        return Some(format!(
            "its receipts ({}) are not the plan's steps ({})",
            steps.join(", "),
            expected.join(", ")
        ));
    }
    None
}

/// Lists the first few differing paths and how many more there are.
fn name_paths(drift: &[Difference]) -> String {
    let named: Vec<&str> = drift
        .iter()
        .take(REASON_DIFFERENCES_MAX)
        .map(|d| d.path.as_str())
        .collect();
    let mut text = named.join(", ");
    if drift.len() > named.len() {
        text.push_str(&format!(" and {} more", drift.len() - named.len()));
    }
    text
}

fn short(hash: &str) -> &str {
    hash.get(..16).unwrap_or(hash)
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Computes the release gate of `plan` from its attempt `history` (any order).
pub fn gate(plan: &Plan, history: &[AttemptRecord]) -> GateReport {
    let forward = forward_attempts(plan, history);
    let mut checks = Vec::with_capacity(CheckName::ALL.len());
    checks.push(plan_ready(plan));
    let Some(&latest) = forward.last() else {
        checks.extend(without_attempt(plan));
        return finish(plan, checks, None, None, Vec::new(), Vec::new());
    };
    let incomplete = incomplete(plan, latest);
    checks.push(latest_succeeded(plan, history, latest, incomplete.as_deref()));
    checks.push(command_delivered(latest));
    let mut tampered = verify_receipts(&latest.receipts);
    let evidence = evidence_intact(latest, &tampered);
    let comparable =
        latest.attempt.status == AttemptStatus::Succeeded && incomplete.is_none() && evidence.verdict == Verdict::Pass;
    checks.push(evidence);
    let baseline = baseline_of(&forward, latest);
    let (check, base_tampered, drift) = matches_baseline(plan, latest, baseline, comparable);
    checks.push(check);
    tampered.extend(base_tampered);
    finish(plan, checks, Some(latest), baseline, tampered, drift)
}

/// The plan's forward attempts (`execute`, `retry`), by number.
fn forward_attempts<'a>(plan: &Plan, history: &'a [AttemptRecord]) -> Vec<&'a AttemptRecord> {
    let mut forward: Vec<&AttemptRecord> = history
        .iter()
        .filter(|r| r.attempt.plan_id == plan.id && r.attempt.action.is_forward())
        .collect();
    forward.sort_by_key(|r| r.attempt.number);
    forward
}

/// Check 1, `plan-ready`.
fn plan_ready(plan: &Plan) -> Check {
    match (plan.status, verify_fingerprint(plan)) {
        (PlanStatus::Ready, Ok(())) => Check::new(CheckName::PlanReady, true, format!("plan {} is READY", plan.id)),
        (PlanStatus::Ready, Err(_)) => Check::new(
            CheckName::PlanReady,
            false,
            format!(
                "plan {} is READY but its content does not match its fingerprint",
                plan.id
            ),
        ),
        (status, _) => Check::new(
            CheckName::PlanReady,
            false,
            format!("plan {} is {status}, not READY", plan.id),
        ),
    }
}

/// Checks 2 to 5 of a plan without a forward attempt: each blocks.
fn without_attempt(plan: &Plan) -> [Check; 4] {
    let none = |name, reason: &str| Check::new(name, false, reason.to_owned());
    [
        none(CheckName::LatestSucceeded, &format!("plan {} has no attempt", plan.id)),
        none(CheckName::CommandDelivered, "no attempt, so no command to check"),
        none(CheckName::EvidenceIntact, "no attempt, so no evidence to verify"),
        none(CheckName::MatchesBaseline, "no attempt to compare"),
    ]
}

/// Check 2, `latest-succeeded`: `latest` is SUCCEEDED, complete (`incomplete` says
/// why not) and no newer compensate attempt of the plan undoes it.
fn latest_succeeded(plan: &Plan, history: &[AttemptRecord], latest: &AttemptRecord, incomplete: Option<&str>) -> Check {
    let me = AttemptRef::of(latest);
    let undo = history
        .iter()
        .filter(|r| {
            r.attempt.plan_id == plan.id
                && r.attempt.action == Action::Compensate
                && r.attempt.number > latest.attempt.number
        })
        .max_by_key(|r| r.attempt.number);
    let (pass, reason) = if let Some(undo) = undo {
        (
            false,
            format!(
                "latest {me} is {} but the newer {} is {} and undoes it",
                latest.attempt.status,
                AttemptRef::of(undo),
                undo.attempt.status
            ),
        )
    } else if latest.attempt.status != AttemptStatus::Succeeded {
        (
            false,
            format!("latest {me} is {}, not SUCCEEDED", latest.attempt.status),
        )
    } else if let Some(why) = incomplete {
        (false, format!("latest {me} is SUCCEEDED but incomplete: {why}"))
    } else {
        (
            true,
            format!(
                "latest {me} is SUCCEEDED with {} of {}",
                latest.receipts.len(),
                plural(plan.steps.len(), "step", "steps")
            ),
        )
    };
    Check::new(CheckName::LatestSucceeded, pass, reason)
}

/// Check 3, `command-delivered`.
fn command_delivered(latest: &AttemptRecord) -> Check {
    let command = &latest.command;
    let (pass, reason) = if command.attempt_id != latest.attempt.id {
        (
            false,
            format!(
                "command {} belongs to attempt {}, not {}",
                command.id, command.attempt_id, latest.attempt.id
            ),
        )
    } else if command.status != CommandStatus::Delivered {
        (
            false,
            format!(
                "command {} of attempt {} is {}, not DELIVERED",
                command.id, latest.attempt.id, command.status
            ),
        )
    } else {
        (
            true,
            format!("command {} of attempt {} is DELIVERED", command.id, latest.attempt.id),
        )
    };
    Check::new(CheckName::CommandDelivered, pass, reason)
}

/// Check 4, `evidence-intact`, given the receipts of `latest` that failed
/// verification.
fn evidence_intact(latest: &AttemptRecord, tampered: &[TamperError]) -> Check {
    let receipts = plural(latest.receipts.len(), "receipt", "receipts");
    let missing: Vec<String> = latest
        .receipts
        .iter()
        .filter(|r| r.evidence.is_none() && r.evidence_sha256.is_none() && r.status != ReceiptStatus::Succeeded)
        .map(|r| format!("receipt {} ({}) is {}", r.ordinal, r.step_code, r.status))
        .collect();
    let (pass, reason) = if !tampered.is_empty() {
        let named: Vec<String> = tampered.iter().map(ToString::to_string).collect();
        (
            false,
            format!(
                "{} failed verification: {}",
                plural(tampered.len(), "receipt", "receipts"),
                named.join("; ")
            ),
        )
    } else if !missing.is_empty() {
        (
            false,
            format!(
                "{} of {receipts} of attempt {} have no evidence: {}",
                missing.len(),
                latest.attempt.id,
                missing.join(", ")
            ),
        )
    } else if latest.receipts.is_empty() {
        (false, format!("attempt {} has no receipts", latest.attempt.id))
    } else {
        (
            true,
            format!(
                "the evidence of all {receipts} of attempt {} matches its SHA-256",
                latest.attempt.id
            ),
        )
    };
    Check::new(CheckName::EvidenceIntact, pass, reason)
}

/// The baseline of `latest`: the highest-numbered forward attempt below it that is
/// SUCCEEDED with its command DELIVERED.
fn baseline_of<'a>(forward: &[&'a AttemptRecord], latest: &AttemptRecord) -> Option<&'a AttemptRecord> {
    forward
        .iter()
        .rev()
        .find(|r| {
            r.attempt.number < latest.attempt.number
                && r.attempt.input_sha256 == latest.attempt.input_sha256
                && r.attempt.status == AttemptStatus::Succeeded
                && r.command.status == CommandStatus::Delivered
        })
        .copied()
}

/// Check 5, `matches-baseline`, with the baseline's receipts that failed verification
/// and the fields that drifted from it. Only a `comparable` latest (complete,
/// SUCCEEDED, intact evidence) is compared.
fn matches_baseline(
    plan: &Plan,
    latest: &AttemptRecord,
    baseline: Option<&AttemptRecord>,
    comparable: bool,
) -> (Check, Vec<TamperError>, Vec<Difference>) {
    let me = AttemptRef::of(latest);
    match baseline {
        _ if !comparable => {
            let with = baseline.map_or_else(String::new, |b| format!(" with baseline {}", AttemptRef::of(b)));
            let reason = format!(
                "latest {me} was not compared{with}: it is not a complete, SUCCEEDED attempt with intact evidence"
            );
            (
                Check::new(CheckName::MatchesBaseline, false, reason),
                Vec::new(),
                Vec::new(),
            )
        }
        Some(base) => compare_with_baseline(plan, latest, base),
        None => {
            let of_input = if latest.attempt.input_sha256.is_some() {
                " with its input"
            } else {
                ""
            };
            let reason =
                format!("latest {me} is the first successful delivered attempt{of_input}: it sets the baseline");
            (
                Check::new(CheckName::MatchesBaseline, true, reason),
                Vec::new(),
                Vec::new(),
            )
        }
    }
}

/// Check 5 against a baseline `base`: it must verify, and its semantic fingerprint
/// equal that of `latest`.
fn compare_with_baseline(
    plan: &Plan,
    latest: &AttemptRecord,
    base: &AttemptRecord,
) -> (Check, Vec<TamperError>, Vec<Difference>) {
    let base_ref = AttemptRef::of(base);
    let base_tampered = verify_receipts(&base.receipts);
    if let Some(first) = base_tampered.first() {
        let reason = format!(
            "baseline {base_ref} cannot be trusted: {} failed verification (first: {first})",
            plural(base_tampered.len(), "receipt", "receipts")
        );
        return (
            Check::new(CheckName::MatchesBaseline, false, reason),
            base_tampered,
            Vec::new(),
        );
    }
    let semantic = semantic_fingerprint(plan, &latest.receipts);
    let base_semantic = semantic_fingerprint(plan, &base.receipts);
    if base_semantic == semantic {
        let reason = format!(
            "semantic fingerprint {} equals that of baseline {base_ref}",
            short(&semantic)
        );
        return (
            Check::new(CheckName::MatchesBaseline, true, reason),
            Vec::new(),
            Vec::new(),
        );
    }
    let drift = differences(plan, &base.receipts, &latest.receipts);
    let reason = format!(
        "semantic fingerprint {} differs from {} of baseline {base_ref}: {} {}",
        short(&semantic),
        short(&base_semantic),
        plural(drift.len(), "field differs:", "fields differ:"),
        name_paths(&drift)
    );
    (Check::new(CheckName::MatchesBaseline, false, reason), Vec::new(), drift)
}

fn finish(
    plan: &Plan,
    checks: Vec<Check>,
    latest: Option<&AttemptRecord>,
    baseline: Option<&AttemptRecord>,
    tampered: Vec<TamperError>,
    drift: Vec<Difference>,
) -> GateReport {
    let verdict = Verdict::of(checks.iter().all(|c| c.verdict == Verdict::Pass));
    GateReport {
        plan_id: plan.id.clone(),
        plan_name: plan.name.clone(),
        plan_status: plan.status,
        verdict,
        checks,
        latest: latest.map(AttemptRef::of),
        raw_fingerprint: latest.map(|r| raw_fingerprint(&r.receipts)),
        semantic_fingerprint: latest.map(|r| semantic_fingerprint(plan, &r.receipts)),
        baseline: baseline.map(AttemptRef::of),
        baseline_semantic_fingerprint: baseline.map(|r| semantic_fingerprint(plan, &r.receipts)),
        tampered,
        drift,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::{canonical_json, sha256_hex};
    use crate::ids::Timestamp;
    use crate::model::{Attempt, Command, Receipt};
    use crate::plan::PlanSpec;
    use serde_json::{json, Value};

    fn plan() -> Plan {
        let spec: PlanSpec = serde_json::from_value(json!({
            "name": "p",
            "recovery": "replay",
            "steps": [{"code": "a", "executor": "dry-run:v1"}, {"code": "b", "executor": "dry-run:v1"}],
        }))
        .unwrap();
        spec.into_plan(&["dry-run:v1"], PlanId::new("pln-1"), Timestamp::from_millis(0))
            .unwrap()
    }

    fn delivered(n: u32, action: Action, evidence: &[Value]) -> AttemptRecord {
        let id = AttemptId::new(format!("att-{n}"));
        let receipts = ["a", "b"]
            .iter()
            .zip(evidence)
            .zip(1u32..)
            .map(|((code, ev), ordinal)| {
                let text = canonical_json(ev);
                Receipt {
                    payload: None,
                    attempt_id: id.clone(),
                    ordinal,
                    step_code: (*code).into(),
                    idempotency_key: format!("ik-{n}-{ordinal}"),
                    executor: String::new(),
                    target: String::new(),
                    status: ReceiptStatus::Succeeded,
                    evidence_sha256: Some(sha256_hex(text.as_bytes())),
                    evidence: Some(text),
                    target_receipt: None,
                    error: None,
                    started_at: None,
                    finished_at: None,
                }
            })
            .collect();
        AttemptRecord {
            attempt: Attempt {
                input: None,
                input_sha256: None,
                order_key: None,
                id: id.clone(),
                plan_id: PlanId::new("pln-1"),
                number: n,
                action,
                status: AttemptStatus::Succeeded,
                created_at: Timestamp::from_millis(0),
                started_at: None,
                finished_at: None,
                error: None,
                trace: None,
                enqueue_key: None,
                request_sha256: None,
            },
            command: Command {
                id: CommandId::new(format!("cmd-{n}")),
                attempt_id: id,
                status: CommandStatus::Delivered,
                available_at: Timestamp::from_millis(0),
                lease_owner: None,
                lease_token: None,
                lease_until: None,
                last_heartbeat_at: None,
                delivery_count: 1,
                last_error: None,
                finished_at: None,
                queue: String::new(),
                executor: String::new(),
                target: String::new(),
            },
            receipts,
        }
    }

    fn same(n: u32) -> AttemptRecord {
        delivered(
            n,
            Action::Execute,
            &[json!({"sandbox_id": format!("s{n}"), "v": 1}), json!({})],
        )
    }

    fn verdicts(r: &GateReport) -> Vec<&'static str> {
        r.checks.iter().map(|c| c.verdict.as_str()).collect()
    }

    #[test]
    fn the_first_delivery_sets_the_baseline() {
        let r = gate(&plan(), &[same(1)]);
        assert!(r.passed(), "{r:#?}");
        assert!(r.baseline.is_none());
        assert!(r.checks[4].reason.contains("sets the baseline"));
    }

    #[test]
    fn a_second_delivery_is_compared_with_the_first() {
        let r = gate(&plan(), &[same(2), same(1)]);
        assert!(r.passed(), "{r:#?}");
        assert_eq!(r.baseline.as_ref().map(|b| b.number), Some(1));
        assert_eq!(r.semantic_fingerprint, r.baseline_semantic_fingerprint);
    }

    #[test]
    fn drift_blocks_and_names_the_field() {
        let drifted = delivered(2, Action::Retry, &[json!({"v": 2}), json!({})]);
        let r = gate(&plan(), &[same(1), drifted]);
        assert_eq!(verdicts(&r), ["PASS", "PASS", "PASS", "PASS", "BLOCK"]);
        assert_eq!(r.drift.len(), 1);
        assert!(
            r.checks[4].reason.ends_with("1 field differs: /receipts/0/evidence/v"),
            "{}",
            r.checks[4].reason
        );
    }

    #[test]
    fn a_newer_open_or_failed_attempt_blocks() {
        for status in [
            AttemptStatus::Queued,
            AttemptStatus::Running,
            AttemptStatus::Failed,
            AttemptStatus::Aborted,
        ] {
            let mut newer = same(2);
            newer.attempt.status = status;
            let r = gate(&plan(), &[same(1), newer]);
            assert_eq!(r.checks[1].verdict, Verdict::Block, "{status}");
            assert_eq!(r.checks[4].verdict, Verdict::Block, "{status}");
        }
    }

    #[test]
    fn a_newer_compensation_blocks_and_a_later_delivery_is_gated_normally() {
        let undo = delivered(2, Action::Compensate, &[json!({}), json!({})]);
        let r = gate(&plan(), &[same(1), undo.clone()]);
        assert_eq!(verdicts(&r), ["PASS", "BLOCK", "PASS", "PASS", "PASS"]);
        assert!(r.checks[1].reason.contains("compensate"), "{}", r.checks[1].reason);
        let r = gate(&plan(), &[same(1), undo, same(3)]);
        assert!(r.passed(), "{r:#?}");
        assert_eq!(r.baseline.as_ref().map(|b| b.number), Some(1));
    }

    #[test]
    fn a_tampered_baseline_blocks() {
        let mut base = same(1);
        base.receipts[1].evidence = Some("{\"x\":1}".into());
        let r = gate(&plan(), &[base, same(2)]);
        assert_eq!(verdicts(&r), ["PASS", "PASS", "PASS", "PASS", "BLOCK"]);
        assert_eq!(r.tampered.len(), 1);
    }

    #[test]
    fn an_incomplete_succeeded_attempt_blocks() {
        let mut short = same(1);
        short.receipts.pop();
        let r = gate(&plan(), &[short]);
        assert_eq!(verdicts(&r), ["PASS", "BLOCK", "PASS", "PASS", "BLOCK"]);
        assert!(
            r.checks[1].reason.contains("are not the plan's steps (a, b)"),
            "{}",
            r.checks[1].reason
        );
    }
}
