//! Text and JSON renderings of plans and attempts. No rendering ever includes a
//! lease token: `Command` skips it when serialized and the text forms never read it.
//!
//! Every text rendering is total: any value a ledger answers, damaged or hostile,
//! renders without a panic. Every stored text (names, codes, ids, errors, owners) is
//! shown through [`clean`], so control characters cannot forge lines or drive the
//! terminal, and a stored digest that is not 64 hex digits shows as
//! `<not a sha-256>` ([`short_sha`]).

use leasehold::text::{clean, short_sha};
use leasehold_engine::evidence::{raw_fingerprint, semantic_fingerprint};
use leasehold_engine::policy::resolve;
use leasehold_engine::{AttemptRecord, AttemptStatus, CommandStatus, Plan, RetryPolicy, Timestamp};
use serde::Serialize;
use std::fmt::{Display, Write};

/// A stored value as terminal-safe text.
fn c(value: impl Display) -> String {
    clean(&value.to_string()).into_owned()
}

/// Prints a value as pretty JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => outln!("{text}"),
        Err(e) => errln!("error: cannot render JSON: {e}"),
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
            c(&p.id),
            p.status,
            c(&p.name),
            p.steps.len(),
            p.recovery,
            short_sha(&p.fingerprint)
        );
    }
    out
}

/// A plan with its steps.
pub fn plan(p: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "plan        {}", c(&p.id));
    let _ = writeln!(out, "name        {}", c(&p.name));
    let _ = writeln!(out, "status      {}", p.status);
    let _ = writeln!(out, "recovery    {}", p.recovery);
    let _ = writeln!(out, "fingerprint {}", c(&p.fingerprint));
    if !p.volatile_fields.is_empty() {
        let _ = writeln!(out, "volatile    {}", c(p.volatile_fields.join(", ")));
    }
    let _ = writeln!(out, "registered  {}", p.created_at);
    let _ = writeln!(out, "retry       {}", policy(&resolve(p.retry.as_ref(), None)));
    if let Some(input) = &p.input {
        let fields: Vec<String> = input.iter().map(|(name, f)| input_field(name, f)).collect();
        let _ = writeln!(out, "input       {}", c(fields.join(", ")));
        let _ = writeln!(out, "on failure  {}", p.on_failure());
    }
    let _ = writeln!(out, "steps:");
    for (i, s) in p.steps.iter().enumerate() {
        let _ = write!(out, "  {}. {} ({})", i + 1, c(&s.code), c(&s.executor));
        if s.retry.is_some() {
            let _ = write!(out, " retry: {}", policy(&resolve(p.retry.as_ref(), s.retry.as_ref())));
        }
        out.push('\n');
    }
    out
}

/// An `[input]` field as `name (type, required, at most N bytes)`.
fn input_field(name: &str, f: &leasehold_engine::input::InputField) -> String {
    let mut traits = vec![f.kind.clone()];
    if f.required {
        traits.push("required".to_owned());
    }
    if let Some(max) = f.max_bytes {
        traits.push(format!("at most {max} bytes"));
    }
    format!("{name} ({})", traits.join(", "))
}

/// `text` cut to at most `max` characters, with `…` when it was longer.
fn clipped(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// A delivery policy on one line.
pub fn policy(p: &RetryPolicy) -> String {
    let deadline = p
        .deadline_secs
        .map_or_else(|| "no deadline".to_owned(), |s| format!("deadline {s} s after enqueue"));
    format!(
        "at most {} deliveries, backoff {} to {} ms, {} tries per delivery, {deadline}",
        p.max_deliveries, p.backoff_base_ms, p.backoff_max_ms, p.step_max_tries
    )
}

/// When a QUEUED attempt's command is next claimable, if that is after `now`: the
/// time and whether it waits out a give-back's backoff (it was delivered before)
/// or a scheduled start.
pub fn next_delivery(r: &AttemptRecord, now: Timestamp) -> Option<(Timestamp, &'static str)> {
    let cmd = &r.command;
    let waiting = r.attempt.status == AttemptStatus::Queued && cmd.status == CommandStatus::Pending;
    if !waiting || cmd.available_at <= now {
        return None;
    }
    let why = if cmd.delivery_count > 0 {
        "backed off after a failed delivery"
    } else {
        "scheduled"
    };
    Some((cmd.available_at, why))
}

/// An attempt, its command and receipts, at `now`; `policy` is its plan's policy
/// for the attempt, when the plan could be read, and `waits_for` what it waits for
/// when no live worker can run its next step ([`leasehold::ledger::fleet::waits_for`]).
pub fn status(r: &AttemptRecord, policy: Option<&RetryPolicy>, waits_for: Option<&str>, now: Timestamp) -> String {
    let (a, cmd) = (&r.attempt, &r.command);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "attempt     {} (#{} of plan {}, {})",
        c(&a.id),
        a.number,
        c(&a.plan_id),
        a.action
    );
    let _ = writeln!(out, "status      {}", a.status);
    let _ = writeln!(out, "created     {}", a.created_at);
    let _ = writeln!(out, "started     {}", ts(a.started_at));
    let _ = writeln!(out, "finished    {}", ts(a.finished_at));
    if let Some(e) = &a.error {
        let _ = writeln!(out, "error       {}", c(e));
    }
    if let Some(t) = &a.trace {
        let _ = writeln!(out, "trace       {} (span {})", t.trace_id(), t.span_id());
    }
    if let (Some(input), Some(sha)) = (&a.input, &a.input_sha256) {
        let _ = writeln!(
            out,
            "input       {} (sha256 {})",
            c(clipped(input, 200)),
            short_sha(sha)
        );
    }
    if let Some(key) = &a.order_key {
        let _ = writeln!(out, "order key   {}", c(key));
    }
    let _ = writeln!(out, "command     {} {}", c(&cmd.id), cmd.status);
    let _ = writeln!(
        out,
        "  owner           {}",
        c(cmd.lease_owner.as_deref().unwrap_or("-"))
    );
    let _ = writeln!(out, "  last heartbeat  {}", ts(cmd.last_heartbeat_at));
    let _ = writeln!(out, "  lease until     {}", ts(cmd.lease_until));
    let _ = match policy {
        Some(p) => writeln!(
            out,
            "  delivery count  {} (at most {})",
            cmd.delivery_count, p.max_deliveries
        ),
        None => writeln!(out, "  delivery count  {}", cmd.delivery_count),
    };
    let _ = writeln!(out, "  last error      {}", c(cmd.last_error.as_deref().unwrap_or("-")));
    if let Some((at, why)) = next_delivery(r, now) {
        let _ = writeln!(
            out,
            "  next delivery   {at} (in {}, {why})",
            super::when::span(at.millis_since(now))
        );
    }
    if cmd.status == CommandStatus::Waiting {
        let _ = writeln!(out, "  waits for       the attempts ahead of it on its order key");
    }
    if let Some(why) = waits_for {
        let _ = writeln!(out, "  waits for       {}", c(why));
    }
    let _ = writeln!(out, "receipts:");
    for rc in &r.receipts {
        let _ = write!(
            out,
            "  {}. {:<24} {:<9} key {}",
            rc.ordinal,
            c(&rc.step_code),
            rc.status,
            c(&rc.idempotency_key)
        );
        if !rc.target.is_empty() {
            let _ = write!(out, " target {}", c(&rc.target));
        }
        if let Some(sha) = &rc.evidence_sha256 {
            let _ = write!(out, " evidence {}", short_sha(sha));
        }
        if let Some(e) = &rc.error {
            let _ = write!(out, " error: {}", c(e));
        }
        out.push('\n');
    }
    out
}

/// Every attempt of a plan, one line each.
pub fn history(p: &Plan, records: &[AttemptRecord]) -> String {
    let mut out = format!("plan {} ({})\n", c(&p.id), c(&p.name));
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
            c(&r.attempt.id),
            r.attempt.action.to_string(),
            r.attempt.status.to_string(),
            r.command.status.to_string(),
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
        c(&r.attempt.id),
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

#[cfg(test)]
mod props {
    //! Every rendering is total: arbitrary stored values (any text, any digest, any
    //! timestamp, any status) render without a panic, line for line, with no raw
    //! control character.

    use super::*;
    use leasehold::text::needs_escape;
    use leasehold_engine::{
        Action, Attempt, AttemptId, AttemptStatus, Command, CommandId, CommandStatus, PlanId, PlanStatus, Receipt,
        ReceiptStatus, Recovery, RetrySpec, Step,
    };
    use proptest::prelude::*;

    /// A stored retry spec, any values (a damaged ledger's too).
    fn retry() -> impl Strategy<Value = Option<RetrySpec>> {
        let value = || prop::option::of(any::<i64>());
        prop::option::of(
            (value(), value(), value(), value(), value()).prop_map(|(a, b, c, d, e)| RetrySpec {
                max_deliveries: a,
                backoff_base_ms: b,
                backoff_max_ms: c,
                step_max_tries: d,
                deadline_secs: e,
            }),
        )
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[ -~\n\r\t\u{1b}\u{7f}\u{85}\u{202e}é]{0,80}",
            "[0-9a-f]{64}",
        ]
    }

    fn time() -> impl Strategy<Value = Timestamp> {
        prop_oneof![any::<i64>(), 0i64..4_000_000_000_000].prop_map(Timestamp::from_millis)
    }

    fn any_plan() -> impl Strategy<Value = Plan> {
        (
            (text(), text(), text(), time()),
            prop::sample::select(PlanStatus::ALL),
            prop::sample::select(Recovery::ALL),
            prop::collection::vec((text(), text(), retry()), 0..4),
            (prop::collection::vec(text(), 0..3), retry()),
        )
            .prop_map(
                |((id, name, fingerprint, created_at), status, recovery, steps, (volatile, retry))| Plan {
                    input: None,
                    on_failure: None,
                    id: PlanId::new(id),
                    name,
                    status,
                    recovery,
                    steps: steps
                        .into_iter()
                        .map(|(code, executor, retry)| Step {
                            code,
                            executor,
                            target: None,
                            payload: serde_json::json!({}),
                            retry,
                        })
                        .collect(),
                    volatile_fields: volatile,
                    queue: None,
                    fingerprint,
                    created_at,
                    retry,
                },
            )
    }

    fn receipt() -> impl Strategy<Value = Receipt> {
        (
            (text(), any::<u32>(), text(), text()),
            prop::sample::select(ReceiptStatus::ALL),
            (
                prop::option::of(text()),
                prop::option::of(text()),
                prop::option::of(text()),
            ),
            (prop::option::of(time()), prop::option::of(time())),
        )
            .prop_map(
                |((attempt, ordinal, code, key), status, (evidence, sha, error), (started, finished))| Receipt {
                    payload: None,
                    attempt_id: AttemptId::new(attempt),
                    ordinal,
                    step_code: code,
                    idempotency_key: key,
                    executor: String::new(),
                    target: String::new(),
                    status,
                    evidence: evidence.clone(),
                    evidence_sha256: sha,
                    target_receipt: evidence,
                    error,
                    started_at: started,
                    finished_at: finished,
                },
            )
    }

    fn record() -> impl Strategy<Value = AttemptRecord> {
        (
            (text(), text(), any::<u32>(), prop::sample::select(Action::ALL)),
            prop::sample::select(AttemptStatus::ALL),
            prop::sample::select(CommandStatus::ALL),
            (time(), prop::option::of(time()), prop::option::of(text())),
            (text(), prop::option::of(text()), any::<u32>(), prop::option::of(text())),
            prop::collection::vec(receipt(), 0..4),
        )
            .prop_map(
                |(
                    (id, plan, number, action),
                    status,
                    cstatus,
                    (at, maybe_at, error),
                    (cid, owner, count, last),
                    receipts,
                )| {
                    AttemptRecord {
                        attempt: Attempt {
                            input: None,
                            input_sha256: None,
                            order_key: None,
                            id: AttemptId::new(id.clone()),
                            plan_id: PlanId::new(plan),
                            number,
                            action,
                            status,
                            created_at: at,
                            started_at: maybe_at,
                            finished_at: maybe_at,
                            error,
                            trace: None,
                            enqueue_key: None,
                            request_sha256: None,
                        },
                        command: Command {
                            id: CommandId::new(cid),
                            attempt_id: AttemptId::new(id),
                            status: cstatus,
                            available_at: at,
                            lease_owner: owner,
                            lease_token: None,
                            lease_until: maybe_at,
                            last_heartbeat_at: maybe_at,
                            delivery_count: count,
                            last_error: last,
                            finished_at: maybe_at,
                            queue: String::new(),
                            executor: String::new(),
                            target: String::new(),
                        },
                        receipts,
                    }
                },
            )
    }

    /// No raw control character but the line ends.
    fn clean_lines(out: &str) -> bool {
        !out.chars().any(|c| c != '\n' && needs_escape(c))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn plans_render_one_line_each(plans in prop::collection::vec(any_plan(), 0..4)) {
            let out = plan_list(&plans);
            prop_assert!(clean_lines(&out));
            prop_assert_eq!(out.lines().count(), plans.len().max(1));
            for p in &plans {
                let shown = plan(p);
                prop_assert!(clean_lines(&shown));
                let volatile = usize::from(!p.volatile_fields.is_empty());
                prop_assert_eq!(shown.lines().count(), 8 + volatile + p.steps.len());
            }
        }

        #[test]
        fn attempts_render_line_for_line(
            p in any_plan(),
            records in prop::collection::vec(record(), 0..3),
            now in time(),
            with_policy in any::<bool>(),
        ) {
            for r in &records {
                let policy = with_policy.then(|| p.policy(""));
                let out = status(r, policy.as_ref(), None, now);
                prop_assert!(clean_lines(&out));
                let error = usize::from(r.attempt.error.is_some());
                let waiting = r.attempt.status == AttemptStatus::Queued
                    && r.command.status == CommandStatus::Pending
                    && r.command.available_at > now;
                let next = usize::from(waiting);
                let behind_key = usize::from(r.command.status == CommandStatus::Waiting);
                prop_assert_eq!(out.lines().count(), 12 + error + next + behind_key + r.receipts.len());
                prop_assert_eq!(out.contains("next delivery"), waiting);
                let shown = outcome(&p, r);
                prop_assert!(clean_lines(&shown));
                prop_assert_eq!(shown.lines().count(), 3);
            }
            let out = history(&p, &records);
            prop_assert!(clean_lines(&out));
            prop_assert_eq!(out.lines().count(), 1 + records.len().max(1));
            let report = leasehold::report::gate_text(&leasehold_engine::gate::gate(&p, &records), &p);
            prop_assert!(clean_lines(&report));
            if let [left, right, ..] = records.as_slice() {
                let comparison = leasehold_engine::evidence::compare(&p, left, right);
                prop_assert!(clean_lines(&leasehold::report::comparison_text(&comparison, &p)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_engine::{Action, Attempt, AttemptId, Command, CommandId, PlanId};

    fn queued(delivery_count: u32, available_at: i64) -> AttemptRecord {
        AttemptRecord {
            attempt: Attempt {
                input: None,
                input_sha256: None,
                order_key: None,
                id: AttemptId::new("att-1"),
                plan_id: PlanId::new("pln-1"),
                number: 1,
                action: Action::Execute,
                status: AttemptStatus::Queued,
                created_at: Timestamp::from_millis(0),
                started_at: None,
                finished_at: None,
                error: None,
                trace: None,
                enqueue_key: None,
                request_sha256: None,
            },
            command: Command {
                id: CommandId::new("cmd-1"),
                attempt_id: AttemptId::new("att-1"),
                status: CommandStatus::Pending,
                available_at: Timestamp::from_millis(available_at),
                lease_owner: None,
                lease_token: None,
                lease_until: None,
                last_heartbeat_at: None,
                delivery_count,
                last_error: (delivery_count > 0).then(|| "step 1: 503".to_owned()),
                finished_at: None,
                queue: String::new(),
                executor: String::new(),
                target: String::new(),
            },
            receipts: Vec::new(),
        }
    }

    #[test]
    fn a_waiting_command_shows_when_and_why() {
        let now = Timestamp::from_millis(10_000);
        let policy = RetryPolicy {
            max_deliveries: 3,
            ..RetryPolicy::default()
        };
        let backed_off = status(&queued(2, 75_000), Some(&policy), None, now);
        assert!(backed_off.contains("  delivery count  2 (at most 3)\n"), "{backed_off}");
        assert!(backed_off.contains("  last error      step 1: 503\n"), "{backed_off}");
        assert!(
            backed_off.contains(
                "  next delivery   1970-01-01T00:01:15.000Z (in 1 min 5 s, backed off after a failed delivery)\n"
            ),
            "{backed_off}"
        );
        let scheduled = status(&queued(0, 3_610_000), None, None, now);
        assert!(scheduled.contains("  delivery count  0\n"), "{scheduled}");
        assert!(scheduled.contains("(in 1 h 0 min, scheduled)"), "{scheduled}");
        // Due already: nothing to wait for.
        assert!(!status(&queued(1, 10_000), None, None, now).contains("next delivery"));
    }
}
