//! Text and JSON renderings of plans and attempts. No rendering ever includes a
//! lease token: `Command` skips it when serialized and the text forms never read it.

use leasehold_engine::evidence::{raw_fingerprint, semantic_fingerprint};
use leasehold_engine::{AttemptRecord, Plan, Timestamp};
use serde::Serialize;
use std::fmt::Write;

/// Prints a value as pretty JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("error: cannot render JSON: {e}"),
    }
}

fn ts(t: Option<Timestamp>) -> String {
    t.map_or_else(|| "-".to_owned(), |t| t.to_rfc3339())
}

/// One line per plan.
pub fn plan_list(plans: &[Plan]) -> String {
    let mut out = String::new();
    if plans.is_empty() {
        out.push_str("no plans\n");
    }
    for p in plans {
        let _ = writeln!(
            out,
            "{}  {:<8} {:<20} {} steps  {}  {}",
            p.id,
            p.status,
            p.name,
            p.steps.len(),
            p.recovery,
            &p.fingerprint[..16]
        );
    }
    out
}

/// A plan with its steps.
pub fn plan(p: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "plan        {}", p.id);
    let _ = writeln!(out, "name        {}", p.name);
    let _ = writeln!(out, "status      {}", p.status);
    let _ = writeln!(out, "recovery    {}", p.recovery);
    let _ = writeln!(out, "fingerprint {}", p.fingerprint);
    if !p.volatile_fields.is_empty() {
        let _ = writeln!(out, "volatile    {}", p.volatile_fields.join(", "));
    }
    let _ = writeln!(out, "registered  {}", p.created_at);
    let _ = writeln!(out, "steps:");
    for (i, s) in p.steps.iter().enumerate() {
        let _ = writeln!(out, "  {}. {} ({})", i + 1, s.code, s.executor);
    }
    out
}

/// An attempt, its command and receipts.
pub fn status(r: &AttemptRecord) -> String {
    let (a, c) = (&r.attempt, &r.command);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "attempt     {} (#{} of plan {}, {})",
        a.id, a.number, a.plan_id, a.action
    );
    let _ = writeln!(out, "status      {}", a.status);
    let _ = writeln!(out, "created     {}", a.created_at);
    let _ = writeln!(out, "started     {}", ts(a.started_at));
    let _ = writeln!(out, "finished    {}", ts(a.finished_at));
    if let Some(e) = &a.error {
        let _ = writeln!(out, "error       {e}");
    }
    let _ = writeln!(out, "command     {} {}", c.id, c.status);
    let _ = writeln!(out, "  owner           {}", c.lease_owner.as_deref().unwrap_or("-"));
    let _ = writeln!(out, "  last heartbeat  {}", ts(c.last_heartbeat_at));
    let _ = writeln!(out, "  lease until     {}", ts(c.lease_until));
    let _ = writeln!(out, "  delivery count  {}", c.delivery_count);
    let _ = writeln!(out, "  last error      {}", c.last_error.as_deref().unwrap_or("-"));
    let _ = writeln!(out, "receipts:");
    for rc in &r.receipts {
        let _ = write!(
            out,
            "  {}. {:<24} {:<9} key {}",
            rc.ordinal, rc.step_code, rc.status, rc.idempotency_key
        );
        if let Some(sha) = &rc.evidence_sha256 {
            let _ = write!(out, " evidence {}", &sha[..16]);
        }
        if let Some(e) = &rc.error {
            let _ = write!(out, " error: {e}");
        }
        out.push('\n');
    }
    out
}

/// Every attempt of a plan, one line each.
pub fn history(p: &Plan, records: &[AttemptRecord]) -> String {
    let mut out = format!("plan {} ({})\n", p.id, p.name);
    if records.is_empty() {
        out.push_str("no attempts\n");
    }
    for r in records {
        let done = r
            .receipts
            .iter()
            .filter(|x| x.status == leasehold_engine::ReceiptStatus::Succeeded)
            .count();
        let _ = writeln!(
            out,
            "  #{:<3} {} {:<10} {:<10} {:<10} {}/{} steps  deliveries {}  created {}",
            r.attempt.number,
            r.attempt.id,
            r.attempt.action,
            r.attempt.status,
            r.command.status,
            done,
            r.receipts.len(),
            r.command.delivery_count,
            r.attempt.created_at
        );
    }
    out
}

/// An attempt's outcome and fingerprints, for the demo.
pub fn outcome(plan: &Plan, r: &AttemptRecord) -> String {
    let done = r
        .receipts
        .iter()
        .filter(|x| x.status == leasehold_engine::ReceiptStatus::Succeeded)
        .count();
    format!(
        "attempt {} (#{}): {} / {}, {}/{} receipts SUCCEEDED, deliveries {}\n  raw fingerprint      {}\n  semantic fingerprint {}\n",
        r.attempt.id,
        r.attempt.number,
        r.attempt.status,
        r.command.status,
        done,
        r.receipts.len(),
        r.command.delivery_count,
        raw_fingerprint(&r.receipts),
        semantic_fingerprint(plan, &r.receipts)
    )
}
