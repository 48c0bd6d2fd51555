//! Text and JSON renderings of comparison and gate reports.
//!
//! The reports are computed by the engine ([`leasehold_engine::evidence::compare`],
//! [`leasehold_engine::gate::gate`]); this module only renders them, for `leasehold
//! compare` and `leasehold gate` (text by default, JSON with `--json`). Renderings
//! are reviewed as insta snapshots under `snapshots/`, so their layout is part of
//! the interface.
//!
//! Contract: a report holds only ids, statuses, step codes, fingerprints, evidence
//! values (volatile identity stripped) and the engine's reasons. It never holds a
//! lease token (nothing here reads `Command::lease_token`) nor a database URL
//! (nothing here is given one). Attempt error texts are not rendered either: they
//! come from executors and operators and are shown by `leasehold status`. Every
//! stored text in a text report (names, codes, ids, reasons, paths, values) goes
//! through [`crate::text::clean`], so none can forge a line or drive a terminal.
//!
//! JSON shapes (keys always present unless marked `?`):
//! - gate: `{"report": "gate", "verdict": "PASS"|"BLOCK", "plan": PLAN,
//!   "checks": [{"name", "verdict", "reason"}], "latest": ATTEMPT|null,
//!   "baseline": ATTEMPT|null, "fingerprints": {"raw", "semantic",
//!   "baseline_semantic"} (each a hex string or null), "tampered": [{"attempt_id",
//!   "ordinal", "step_code", "problem", "computed_sha256"?, "recorded_sha256"?}],
//!   "differences": [{"path", "ordinal", "step_code", "baseline"?, "latest"?}]}`;
//! - comparison: `{"report": "comparison", "verdict": "EQUAL"|"DRIFT"|"INCOMPARABLE",
//!   "plan": PLAN, "left": SIDE, "right": SIDE, "steps_equal", "semantic_equal",
//!   "problems": [string], "differences": [{"path", "ordinal", "step_code",
//!   "left"?, "right"?}]}`;
//! - PLAN is `{"id", "name", "status", "fingerprint"}`; ATTEMPT is `{"attempt_id",
//!   "number", "action", "status", "command_id", "command_status"}`; SIDE is
//!   ATTEMPT plus `"raw_fingerprint"` and `"semantic_fingerprint"`.
//!
//! A difference's side key is omitted when the field is absent on that side; `null`
//! means the field is present and JSON `null`.

use leasehold_engine::evidence::{AttemptSide, Comparison, ComparisonVerdict, Difference, TamperError, TamperProblem};
use leasehold_engine::gate::{AttemptRef, CheckName, GateReport, Verdict};
use leasehold_engine::Plan;
use serde_json::{json, Map, Value};
use std::fmt::Write;

/// The exit status of `leasehold gate` when the verdict is BLOCK.
pub const GATE_BLOCK_EXIT_CODE: i32 = 4;

/// How many characters of a differing value the text reports show.
pub const TEXT_VALUE_CHARS_MAX: usize = 120;

/// The exit status of `leasehold gate`: 0 on PASS, [`GATE_BLOCK_EXIT_CODE`] on BLOCK.
pub fn gate_exit_code(report: &GateReport) -> i32 {
    match report.verdict {
        Verdict::Pass => 0,
        Verdict::Block => GATE_BLOCK_EXIT_CODE,
    }
}

fn plan_json(plan: &Plan) -> Value {
    json!({
        "id": plan.id.as_str(),
        "name": plan.name,
        "status": plan.status.as_str(),
        "fingerprint": plan.fingerprint,
    })
}

fn attempt_json(a: &AttemptRef) -> Value {
    json!({
        "attempt_id": a.attempt_id.as_str(),
        "number": a.number,
        "action": a.action.as_str(),
        "status": a.status.as_str(),
        "command_id": a.command_id.as_str(),
        "command_status": a.command_status.as_str(),
    })
}

fn side_json(s: &AttemptSide) -> Value {
    json!({
        "attempt_id": s.attempt_id.as_str(),
        "number": s.number,
        "action": s.action.as_str(),
        "status": s.status.as_str(),
        "command_id": s.command_id.as_str(),
        "command_status": s.command_status.as_str(),
        "raw_fingerprint": s.raw_fingerprint,
        "semantic_fingerprint": s.semantic_fingerprint,
    })
}

fn difference_json(d: &Difference, left_key: &str, right_key: &str) -> Value {
    let mut out = Map::new();
    out.insert("path".into(), json!(d.path));
    out.insert("ordinal".into(), json!(d.ordinal));
    out.insert("step_code".into(), json!(d.step_code));
    if let Some(v) = &d.left {
        out.insert(left_key.into(), v.clone());
    }
    if let Some(v) = &d.right {
        out.insert(right_key.into(), v.clone());
    }
    Value::Object(out)
}

fn tamper_json(t: &TamperError) -> Value {
    let mut out = json!({
        "attempt_id": t.receipt.attempt_id.as_str(),
        "ordinal": t.receipt.ordinal,
        "step_code": t.receipt.step_code,
        "problem": t.problem.to_string(),
    });
    if let TamperProblem::ShaMismatch { computed, recorded } = &t.problem {
        out["computed_sha256"] = json!(computed);
        out["recorded_sha256"] = json!(recorded);
    }
    out
}

/// The gate report as JSON (shape in the module docs).
pub fn gate_json(report: &GateReport, plan: &Plan) -> Value {
    json!({
        "report": "gate",
        "verdict": report.verdict.as_str(),
        "plan": plan_json(plan),
        "checks": report.checks.iter().map(|c| json!({
            "name": c.name.as_str(),
            "verdict": c.verdict.as_str(),
            "reason": c.reason,
        })).collect::<Vec<_>>(),
        "latest": report.latest.as_ref().map(attempt_json),
        "baseline": report.baseline.as_ref().map(attempt_json),
        "fingerprints": {
            "raw": report.raw_fingerprint,
            "semantic": report.semantic_fingerprint,
            "baseline_semantic": report.baseline_semantic_fingerprint,
        },
        "tampered": report.tampered.iter().map(tamper_json).collect::<Vec<_>>(),
        "differences": report.drift.iter().map(|d| difference_json(d, "baseline", "latest")).collect::<Vec<_>>(),
    })
}

/// A stored value as terminal-safe text.
fn t(value: impl std::fmt::Display) -> String {
    crate::text::clean(&value.to_string()).into_owned()
}

fn attempt_line(a: &AttemptRef) -> String {
    t(format_args!(
        "{} (#{}, {}) {}, command {} {}",
        a.attempt_id, a.number, a.action, a.status, a.command_id, a.command_status
    ))
}

/// A value for a text report: canonical JSON, cut at [`TEXT_VALUE_CHARS_MAX`]
/// characters; `(absent)` when the field is missing.
fn value_text(v: Option<&Value>) -> String {
    let Some(v) = v else {
        return "(absent)".to_owned();
    };
    let text = leasehold_engine::canonical::canonical_json(v);
    if text.chars().count() > TEXT_VALUE_CHARS_MAX {
        t(format_args!(
            "{}…",
            text.chars().take(TEXT_VALUE_CHARS_MAX).collect::<String>()
        ))
    } else {
        t(text)
    }
}

fn differences_text(out: &mut String, diffs: &[Difference], left: &str, right: &str) {
    let width = left.len().max(right.len()) + 1;
    for d in diffs {
        let _ = write!(out, "  {}", t(&d.path));
        if let (Some(ordinal), Some(code)) = (d.ordinal, &d.step_code) {
            let _ = write!(out, "  (receipt {ordinal}, {})", t(code));
        }
        out.push('\n');
        let _ = writeln!(
            out,
            "    {:<width$} {}",
            format!("{left}:"),
            value_text(d.left.as_ref())
        );
        let _ = writeln!(
            out,
            "    {:<width$} {}",
            format!("{right}:"),
            value_text(d.right.as_ref())
        );
    }
}

/// The gate report as readable text: a headline verdict, one line per check, the
/// attempts and fingerprints, then any tampered receipts and differing fields.
pub fn gate_text(report: &GateReport, plan: &Plan) -> String {
    let mut out = String::new();
    let blocking = report.checks.iter().filter(|c| c.verdict == Verdict::Block).count();
    match (report.verdict, &report.latest) {
        (Verdict::Pass, Some(latest)) => {
            let _ = writeln!(
                out,
                "PASS: attempt {} (#{}) of plan {} ({}) may be released",
                t(&latest.attempt_id),
                latest.number,
                t(&plan.id),
                t(&plan.name)
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "BLOCK: plan {} ({}) may not be released: {blocking} of {} checks block",
                t(&plan.id),
                t(&plan.name),
                report.checks.len()
            );
        }
    }
    out.push('\n');
    for c in &report.checks {
        let _ = writeln!(out, "[{}] {}: {}", c.verdict, c.name, t(&c.reason));
    }
    out.push('\n');
    let none = "-".to_owned();
    let _ = writeln!(
        out,
        "latest attempt        {}",
        report.latest.as_ref().map_or_else(|| "none".to_owned(), attempt_line)
    );
    let sets_baseline = report
        .check(CheckName::MatchesBaseline)
        .is_some_and(|c| c.verdict == Verdict::Pass);
    let baseline = match (&report.baseline, &report.latest) {
        (Some(b), _) => attempt_line(b),
        (None, Some(latest)) if sets_baseline => format!("none: attempt #{} sets the baseline", latest.number),
        _ => "none".to_owned(),
    };
    let _ = writeln!(out, "baseline attempt      {baseline}");
    let _ = writeln!(
        out,
        "raw fingerprint       {}",
        t(report.raw_fingerprint.as_ref().unwrap_or(&none))
    );
    let _ = writeln!(
        out,
        "semantic fingerprint  {}",
        t(report.semantic_fingerprint.as_ref().unwrap_or(&none))
    );
    let _ = writeln!(
        out,
        "baseline semantic     {}",
        t(report.baseline_semantic_fingerprint.as_ref().unwrap_or(&none))
    );
    if !report.tampered.is_empty() {
        let _ = writeln!(out, "\ntampered receipts:");
        for tampered in &report.tampered {
            let _ = writeln!(out, "  {}", t(tampered));
        }
    }
    if !report.drift.is_empty() {
        let _ = writeln!(out, "\ndifferences from the baseline ({}):", report.drift.len());
        differences_text(&mut out, &report.drift, "baseline", "latest");
    }
    out
}

/// The comparison as JSON (shape in the module docs).
pub fn comparison_json(c: &Comparison, plan: &Plan) -> Value {
    json!({
        "report": "comparison",
        "verdict": c.verdict.as_str(),
        "plan": plan_json(plan),
        "left": side_json(&c.left),
        "right": side_json(&c.right),
        "steps_equal": c.steps_equal,
        "semantic_equal": c.semantic_equal,
        "problems": c.problems,
        "differences": c.differences.iter().map(|d| difference_json(d, "left", "right")).collect::<Vec<_>>(),
    })
}

fn side_line(s: &AttemptSide) -> String {
    t(format_args!(
        "{} (#{}, {}) {}, command {} {}",
        s.attempt_id, s.number, s.action, s.status, s.command_id, s.command_status
    ))
}

/// The comparison as readable text: a headline verdict, both attempts with their
/// fingerprints, then any problems and every differing field.
pub fn comparison_text(c: &Comparison, plan: &Plan) -> String {
    let mut out = String::new();
    let (l, r) = (c.left.number, c.right.number);
    let _ = match c.verdict {
        ComparisonVerdict::Equal => writeln!(
            out,
            "EQUAL: attempts #{l} and #{r} of plan {} ({}) delivered the same evidence",
            t(&plan.id),
            t(&plan.name)
        ),
        ComparisonVerdict::Drift => writeln!(
            out,
            "DRIFT: attempts #{l} and #{r} of plan {} ({}) differ in {} {}",
            t(&plan.id),
            t(&plan.name),
            c.differences.len(),
            if c.differences.len() == 1 { "field" } else { "fields" }
        ),
        ComparisonVerdict::Incomparable => writeln!(
            out,
            "INCOMPARABLE: attempts #{l} and #{r} of plan {} ({}) cannot be compared",
            t(&plan.id),
            t(&plan.name)
        ),
    };
    out.push('\n');
    let _ = writeln!(out, "left   {}", side_line(&c.left));
    let _ = writeln!(out, "right  {}", side_line(&c.right));
    out.push('\n');
    let same = |b: bool| if b { "equal" } else { "differ" };
    let _ = writeln!(out, "steps                 {}", same(c.steps_equal));
    let _ = writeln!(out, "semantic fingerprints {}", same(c.semantic_equal));
    let _ = writeln!(out, "  left                {}", t(&c.left.semantic_fingerprint));
    let _ = writeln!(out, "  right               {}", t(&c.right.semantic_fingerprint));
    let _ = writeln!(
        out,
        "raw fingerprints      {}",
        same(c.left.raw_fingerprint == c.right.raw_fingerprint)
    );
    let _ = writeln!(out, "  left                {}", t(&c.left.raw_fingerprint));
    let _ = writeln!(out, "  right               {}", t(&c.right.raw_fingerprint));
    if !c.problems.is_empty() {
        let _ = writeln!(out, "\nproblems:");
        for p in &c.problems {
            let _ = writeln!(out, "  {}", t(p));
        }
    }
    if c.differences.is_empty() {
        let _ = writeln!(out, "\ndifferences: none");
    } else {
        let _ = writeln!(out, "\ndifferences ({}):", c.differences.len());
        differences_text(&mut out, &c.differences, "left", "right");
    }
    out
}
