//! What an operator deploys, held to the binary it deploys (docs/operations.md):
//! every metric the alert rules, their unit tests and the Grafana dashboard name is
//! one `leasehold serve` exports at `/metrics` (its router, scraped once every metric
//! has a sample), and the dashboard shows every one of them; the dashboard's queries are PromQL (`promtool`, when installed); the
//! systemd units start the binary with flags it accepts and give it time to drain;
//! and `--version` names the release and each backend's schema version.
//!
//! `deploy/check` (run by `.ci/run`) checks the rest with the tools themselves:
//! `promtool check rules`, `promtool test rules`, `systemd-analyze verify`.

#[path = "serve_common.rs"]
mod common;
mod procs;

use leasehold::clock::SystemClock;
use leasehold::executor::DryRun;
use leasehold::ledger::Ledger;
use leasehold::worker::{RunOptions, Worker, WorkerEvent};
use leasehold_engine::driver::Outcome;
use leasehold_engine::lease::WorkerConfig;
use leasehold_engine::limits::{Breaker, TargetLimit};
use leasehold_engine::transition::Refusal;
use leasehold_engine::{AttemptId, CommandId};
use procs::BIN;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const RULES: &str = "deploy/prometheus/alerts.yml";
const RULE_TESTS: &str = "deploy/prometheus/alerts_test.yml";
const DASHBOARD: &str = "deploy/grafana/leasehold.json";
const UNITS: &str = "deploy/systemd";

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_file(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

// ---- metric names -------------------------------------------------------------

/// Every identifier in `text` that starts with `leasehold_` (a PromQL metric name:
/// letters, digits, `_` and `:`, not preceded by another identifier character).
fn metric_names(text: &str) -> BTreeSet<String> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    for (at, _) in text.match_indices("leasehold_") {
        if text[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let end = text[at..].find(|c: char| !is_ident(c)).map_or(text.len(), |n| at + n);
        names.insert(text[at..end].to_owned());
    }
    names
}

/// Every string of a JSON document, keys aside.
fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON")
}

/// The metric families a scrape declares (`# TYPE name kind`), each with the
/// sample names Prometheus stores for it: a counter's `_total`, a histogram's
/// `_bucket`, `_sum` and `_count`, a gauge's own name.
fn families(scrape: &str) -> BTreeMap<String, Vec<String>> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (name, kind) = l.split_once(' ').expect("# TYPE NAME KIND");
            let samples = match kind {
                "counter" => vec![format!("{name}_total")],
                "histogram" => ["_bucket", "_sum", "_count"].map(|s| format!("{name}{s}")).to_vec(),
                _ => vec![name.to_owned()],
            };
            (name.to_owned(), samples)
        })
        .collect()
}

/// What a worker reports of the troubles a test cannot bring about on cue: a
/// takeover whose heartbeat then fails and whose write is refused, and a delivery
/// abandoned to its lease, then a grace period that ran out.
fn a_troubled_fleet_s_events() -> Vec<WorkerEvent> {
    let claimed = |n: &str| WorkerEvent::Claimed {
        attempt: AttemptId::new(format!("att-{n}")),
        plan: "troubled".into(),
        command: CommandId::new(format!("cmd-{n}")),
        delivery: 2,
        steps: 1,
        skipped: 0,
        queued_ms: None,
    };
    let finished = |n: &str, outcome| WorkerEvent::Finished {
        attempt: AttemptId::new(format!("att-{n}")),
        outcome,
    };
    let refusal = Refusal::StaleToken {
        command: CommandId::new("cmd-1"),
    };
    vec![
        claimed("1"),
        WorkerEvent::HeartbeatFailed {
            attempt: AttemptId::new("att-1"),
            error: "the ledger did not answer".into(),
        },
        finished("1", Outcome::Refused(refusal)),
        claimed("2"),
        finished("2", Outcome::Abandoned("the step ran out of time".into())),
        WorkerEvent::GraceExpired { dropped: 1 },
    ]
}

/// `/metrics` of a server (the real router, on loopback, over a SQLite ledger) that
/// has a sample of every metric: a real worker delivered an attempt through its
/// metrics, a target has limits, an operator reconciled, and the metrics observed a
/// troubled fleet's events ([`a_troubled_fleet_s_events`]).
async fn scrape_a_server_with_every_sample() -> String {
    let server = common::TestServer::start().await;
    let metrics = server.app.metrics();
    let plan = server.plan("deployed", 1).await;
    let record = server.enqueue(&plan).await;
    let worker = Worker::new(
        "deploy-worker",
        Arc::clone(&server.ledger),
        Arc::new(DryRun),
        Arc::new(SystemClock),
        WorkerConfig::clamped(true, 10, 1, 60_000),
    )
    .on_event(metrics.observer("deploy-worker"));
    let options = RunOptions {
        until_idle: true,
        grace_ms: 0,
    };
    assert_eq!(worker.run(std::future::pending(), options).await.delivered, 1);
    let limit = TargetLimit {
        target: plan.steps[0].executor.clone(),
        max_in_flight: Some(2),
        rate: None,
        breaker: Some(Breaker {
            failures: 3,
            cooldown_ms: 60_000,
        }),
    };
    server.ledger.set_limit(limit).await.expect("limits");
    let client = reqwest::Client::new();
    let reconcile = format!("{}/api/v1/attempts/{}/reconcile", server.base, record.attempt.id);
    let answer = client
        .post(reconcile)
        .bearer_auth(&server.operator)
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "reconcile: {}", answer.status());
    for event in a_troubled_fleet_s_events() {
        metrics.observe("troubled-worker", &event);
    }
    let answer = client
        .get(format!("{}/metrics", server.base))
        .bearer_auth(&server.viewer)
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "/metrics: {}", answer.status());
    answer.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_and_the_dashboard_name_is_one_serve_exports() {
    let families = families(&scrape_a_server_with_every_sample().await);
    let exported: BTreeSet<&String> = families.values().flatten().collect();
    assert!(exported.len() > 10, "too few metrics: {exported:?}");
    let mut dashboard_strings = Vec::new();
    strings(&dashboard(), &mut dashboard_strings);
    let named = [
        (RULES, metric_names(&read(RULES))),
        (RULE_TESTS, metric_names(&read(RULE_TESTS))),
        (DASHBOARD, metric_names(&dashboard_strings.join("\n"))),
    ];
    for (file, names) in &named {
        assert!(!names.is_empty(), "{file} names no metric");
        let unknown: Vec<&String> = names.iter().filter(|n| !exported.contains(n)).collect();
        assert!(
            unknown.is_empty(),
            "{file} names metrics that /metrics does not export: {unknown:?}\nexported: {exported:?}"
        );
    }
    // Every family is on the dashboard: a new metric gets its panel.
    let on_dashboard = &named[2].1;
    let missing: Vec<&String> = families
        .iter()
        .filter(|(_, samples)| !samples.iter().any(|s| on_dashboard.contains(s)))
        .map(|(family, _)| family)
        .collect();
    assert!(missing.is_empty(), "{DASHBOARD} shows no panel of {missing:?}");
}

#[test]
fn names_are_read_whole_and_only_where_they_start() {
    let names = metric_names(
        "sum(rate(leasehold_claims_total{job=~\"$job\"}[5m])) / my_leasehold_x + \
         histogram_quantile(0.9, leasehold_step_duration_seconds_bucket)\nleasehold_workers_live",
    );
    let expected = [
        "leasehold_claims_total",
        "leasehold_step_duration_seconds_bucket",
        "leasehold_workers_live",
    ];
    assert_eq!(names, BTreeSet::from(expected.map(String::from)));
    let scrape = "# TYPE leasehold_claims counter\n# TYPE leasehold_queue_wait_seconds histogram\n\
                  # TYPE leasehold_workers_live gauge\nleasehold_workers_live 0\n";
    let samples: Vec<String> = families(scrape).into_values().flatten().collect();
    assert_eq!(
        samples,
        [
            "leasehold_claims_total",
            "leasehold_queue_wait_seconds_bucket",
            "leasehold_queue_wait_seconds_sum",
            "leasehold_queue_wait_seconds_count",
            "leasehold_workers_live",
        ]
    );
}

// ---- the dashboard's queries --------------------------------------------------

/// Each query of a dashboard panel, `(panel title, expression)`.
fn panel_queries(dashboard: &Value) -> Vec<(String, String)> {
    let panels = dashboard["panels"].as_array().expect("panels");
    panels
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_owned();
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            targets.into_iter().map(move |t| {
                let expr = t["expr"].as_str().expect("a target with an expr").to_owned();
                (title.clone(), expr)
            })
        })
        .collect()
}

/// The expression Prometheus receives from Grafana for `expr`, its variables filled
/// in as Grafana would (every job; a 5 m rate window; a 6 h range).
fn as_sent(expr: &str) -> String {
    let sent = expr
        .replace("$__rate_interval", "5m")
        .replace("$__range", "6h")
        .replace("$job", ".*");
    assert!(!sent.contains('$'), "an unknown variable in {expr:?}");
    sent
}

#[test]
fn every_dashboard_panel_queries_prometheus_and_promtool_parses_each_query() {
    let dashboard = dashboard();
    let queries = panel_queries(&dashboard);
    assert!(queries.len() > 10, "{queries:?}");
    let ids: Vec<u64> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().expect("a panel id"))
        .collect();
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), ids.len(), "panel ids repeat");
    // As recording rules, which `promtool check rules` parses as PromQL.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, (_, expr)) in queries.iter().enumerate() {
        let expr = serde_json::to_string(&as_sent(expr)).unwrap();
        rules.push_str(&format!("      - record: dashboard:query_{n}\n        expr: {expr}\n"));
    }
    let Ok(found) = Command::new("promtool").arg("--version").output() else {
        println!("skipped the PromQL parse: no promtool (Debian's prometheus package has it)");
        return;
    };
    assert!(found.status.success());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-queries.yml");
    std::fs::write(&file, &rules).unwrap();
    let out = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool refused a dashboard query:\n{}{}\n{rules}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- the systemd units ----------------------------------------------------------

/// Each unit file of deploy/systemd, `(file name, text)`.
fn units() -> Vec<(String, String)> {
    let mut units: Vec<(String, String)> = std::fs::read_dir(repo_file(UNITS))
        .expect("deploy/systemd")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "service"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    units.sort();
    units
}

/// The values of `key=` in a unit's text, in order.
fn values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("{key}=");
    unit.lines().filter_map(|l| l.strip_prefix(&prefix)).collect()
}

/// A command line of a unit as arguments of the built binary: the installed path
/// replaced, the host (`%H`) and instance (`%i`) specifiers filled in.
fn command_args(line: &str) -> Vec<String> {
    let line = line.replace("%H", "host").replace("%i", "1");
    assert!(
        !line.contains(['%', '"', '\'', '$', '\\']),
        "a specifier, quote, variable or escape this test does not expand: {line}"
    );
    let mut words = line.split_whitespace().map(String::from);
    assert_eq!(words.next().as_deref(), Some("/usr/local/bin/leasehold"), "{line}");
    words.collect()
}

#[test]
fn every_unit_starts_the_binary_with_flags_it_accepts() {
    let units = units();
    let names: Vec<&str> = units.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "leasehold-serve.service",
            "leasehold-worker.service",
            "leasehold-worker@.service"
        ]
    );
    for (name, unit) in &units {
        let commands = [values(unit, "ExecStartPre"), values(unit, "ExecStart")].concat();
        assert!(!values(unit, "ExecStart").is_empty(), "{name}: no ExecStart");
        for line in commands {
            // Flags are parsed up to --help, which then prints the subcommand's help:
            // an unknown flag or a bad value fails first (exit 2).
            let mut args = command_args(line);
            args.push("--help".into());
            let out = Command::new(BIN)
                .args(&args)
                .env_remove("LEASEHOLD_DB")
                .env_remove("LEASEHOLD_HTTP_ALLOW")
                .env_remove("LEASEHOLD_PUBLIC_ORIGIN")
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.contains(&format!("Usage: leasehold {}", args[0])),
                "{name}: leasehold {args:?} was refused: {}{stdout}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Seconds in a systemd time span such as `60s`, `2min` or `90`.
fn seconds(span: &str) -> u64 {
    let (digits, unit) = span.split_at(span.find(|c: char| !c.is_ascii_digit()).unwrap_or(span.len()));
    let n: u64 = digits.parse().unwrap_or_else(|_| panic!("a time span: {span}"));
    match unit {
        "" | "s" => n,
        "min" => n * 60,
        _ => panic!("a time span this test reads: {span}"),
    }
}

#[test]
fn every_unit_is_sandboxed_restarts_on_failure_and_lets_the_grace_period_run_out() {
    let required = [
        ("EnvironmentFile", "/etc/leasehold/leasehold.env"),
        ("Restart", "on-failure"),
        ("DynamicUser", "yes"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", ""),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("SystemCallFilter", "@system-service"),
    ];
    for (name, unit) in units() {
        for (key, value) in required {
            assert!(values(&unit, key).contains(&value), "{name}: no {key}={value}");
        }
        // systemd must not SIGKILL a process still draining after SIGTERM.
        let exec = values(&unit, "ExecStart")[0];
        let args = command_args(exec);
        let grace = args
            .iter()
            .position(|a| a == "--grace-secs")
            .map_or(30, |at| args[at + 1].parse().expect("--grace-secs N"));
        let stop = seconds(values(&unit, "TimeoutStopSec").first().expect("TimeoutStopSec"));
        assert!(grace < stop, "{name}: --grace-secs {grace} but TimeoutStopSec={stop}s");
    }
}

// ---- --version -------------------------------------------------------------------

/// The newest migration of a backend: the largest `NNNN` of `migrations/NAME/`'s files.
fn newest_migration(backend: &str) -> u32 {
    let dir = repo_file(&format!("migrations/{backend}"));
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.unwrap().file_name().to_string_lossy().get(..4)?.parse().ok())
        .max()
        .expect("a migration")
}

#[test]
fn version_names_the_release_and_the_schema_each_backend_migrates_to() {
    let expected = format!(
        "leasehold {} (schema: sqlite {}, postgres {}, mysql {})\n",
        env!("CARGO_PKG_VERSION"),
        newest_migration("sqlite"),
        newest_migration("postgres"),
        newest_migration("mysql")
    );
    for flag in ["--version", "-V"] {
        assert_eq!(procs::run_cli(&[flag]), expected, "{flag}");
    }
    // What `migrate` brings a fresh SQLite ledger to is the version it names.
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let applied = procs::run_cli(&["--db", &db, "migrate"]);
    let newest = applied.trim().rsplit(", ").next().unwrap();
    assert!(
        expected.contains(&format!("sqlite {newest},")),
        "{applied} vs {expected}"
    );
}
