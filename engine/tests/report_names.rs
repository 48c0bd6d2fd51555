//! The names reports, the CLI and the API print for verdicts and gate checks.

use leasehold_engine::evidence::ComparisonVerdict;
use leasehold_engine::gate::{CheckName, Verdict};

#[test]
fn each_comparison_verdict_has_its_upper_case_name_in_text_and_display() {
    for (verdict, name) in [
        (ComparisonVerdict::Equal, "EQUAL"),
        (ComparisonVerdict::Drift, "DRIFT"),
        (ComparisonVerdict::Incomparable, "INCOMPARABLE"),
    ] {
        assert_eq!(verdict.as_str(), name);
        assert_eq!(verdict.to_string(), name);
    }
}

#[test]
fn each_gate_verdict_has_its_upper_case_name_in_text_and_display() {
    for (verdict, name) in [(Verdict::Pass, "PASS"), (Verdict::Block, "BLOCK")] {
        assert_eq!(verdict.as_str(), name);
        assert_eq!(verdict.to_string(), name);
    }
}

#[test]
fn each_gate_check_has_its_kebab_case_name_in_report_order() {
    let names: Vec<(String, &str)> = CheckName::ALL.iter().map(|c| (c.to_string(), c.as_str())).collect();
    assert_eq!(
        names,
        [
            ("plan-ready".to_owned(), "plan-ready"),
            ("latest-succeeded".to_owned(), "latest-succeeded"),
            ("command-delivered".to_owned(), "command-delivered"),
            ("evidence-intact".to_owned(), "evidence-intact"),
            ("matches-baseline".to_owned(), "matches-baseline"),
        ]
    );
}

#[test]
fn a_gate_report_finds_each_check_by_its_name() {
    let spec = leasehold_engine::PlanSpec {
        input: None,
        on_failure: None,
        name: "p".into(),
        queue: None,
        recovery: "resume".into(),
        volatile_fields: vec![],
        steps: vec![leasehold_engine::Step {
            code: "a".into(),
            executor: "dry-run:v1".into(),
            target: None,
            payload: serde_json::json!({}),
            retry: None,
        }],
        retry: None,
    };
    let plan = spec
        .into_plan(
            &["dry-run:v1"],
            leasehold_engine::PlanId::new("plan-1"),
            leasehold_engine::Timestamp::from_millis(0),
        )
        .expect("a valid plan");
    let report = leasehold_engine::gate::gate(&plan, &[]);
    assert!(!report.passed(), "a plan without attempts is blocked");
    for name in CheckName::ALL {
        assert_eq!(report.check(name).map(|c| c.name), Some(name));
    }
}
