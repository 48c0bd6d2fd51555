//! `leasehold bench` end to end: it prints its figures and checks that every attempt
//! was delivered exactly once, and the database agrees.

use serde_json::Value;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

struct Db {
    _dir: tempfile::TempDir,
    url: String,
}

impl Db {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        Db { _dir: dir, url }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("--db")
            .arg(&self.url)
            .args(args)
            .env_remove("LEASEHOLD_DB")
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "leasehold {args:?} failed ({:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

/// The value after `label` on the line that starts with it.
fn figure<'a>(out: &'a str, label: &str) -> &'a str {
    let line = out
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line:\n{out}"));
    line[label.len()..].trim()
}

#[test]
fn bench_delivers_every_attempt_exactly_once_and_prints_its_figures() {
    let db = Db::new();
    let out = db.ok(&[
        "bench",
        "--attempts",
        "30",
        "--workers",
        "2",
        "--steps",
        "6",
        "--batch",
        "1",
    ]);
    assert!(
        out.starts_with("bench: 30 attempts of a 6-step dry-run plan, 2 workers, batch 1, on SqliteLedger\n"),
        "{out}"
    );
    assert!(out.contains("delivered 30 in "), "{out}");
    for label in ["deliveries/s", "claims/s", "steps/s"] {
        let value: f64 = figure(&out, label)
            .parse()
            .unwrap_or_else(|e| panic!("{label}: {e}\n{out}"));
        assert!(value > 0.0, "{label} {value}\n{out}");
    }
    assert!(
        figure(&out, "transactions per attempt").starts_with("7.00 (its claim + 6.00 step writes"),
        "{out}"
    );
    assert!(
        figure(&out, "latency p50 / p99").ends_with("all enqueued before the workers started)"),
        "{out}"
    );
    assert!(figure(&out, "sqlite writer").ends_with(" calls per commit"), "{out}");
    assert_eq!(
        figure(&out, "exactly once"),
        "ok: 30 attempts SUCCEEDED, commands DELIVERED, delivery_count 1",
        "{out}"
    );

    // The database agrees: thirty bench plans, each with one delivered attempt.
    let plans: Value = serde_json::from_str(&db.ok(&["plan", "list", "--json"])).unwrap();
    let plans = plans.as_array().unwrap();
    assert_eq!(plans.len(), 30);
    let name = plans[0]["name"].as_str().unwrap();
    assert!(name.starts_with("bench-"), "{name}");
    let history: Value = serde_json::from_str(&db.ok(&["history", name, "--json"])).unwrap();
    let history = history.as_array().unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0]["attempt"]["status"], "SUCCEEDED");
    assert_eq!(history[0]["command"]["status"], "DELIVERED");
    assert_eq!(history[0]["command"]["delivery_count"], 1);
}

#[test]
fn bench_json_reports_the_exactly_once_check_and_a_second_run_uses_new_plans() {
    let db = Db::new();
    for _ in 0..2 {
        let report: Value = serde_json::from_str(&db.ok(&["bench", "--attempts", "12", "--workers", "3", "--json"]))
            .expect("the report is JSON");
        assert_eq!(report["attempts"], 12);
        assert_eq!(report["steps"], 1);
        assert_eq!(report["workers"], 3);
        assert_eq!(report["counts"]["claimed"], 12);
        assert_eq!(report["transactions_per_attempt"], 2.0);
        assert_eq!(report["verified"]["exactly_once"], 12);
        assert_eq!(report["verified"]["problem_count"], 0);
        assert!(report["deliveries_per_s"].as_f64().unwrap() > 0.0);
        assert!(report["latency_p99_ms"].as_u64() >= report["latency_p50_ms"].as_u64());
        assert!(report.get("baseline").is_none(), "no baseline unless asked for");
        assert!(report.get("server").is_none(), "SQLite has no server to read");
        // The writer thread ran every delivery's ending write (its next claim fused
        // in) and committed them, several to a commit when they waited together.
        let writer = &report["writer"];
        let commits = writer["commits"]
            .as_u64()
            .unwrap_or_else(|| panic!("no commits: {writer}"));
        let calls = writer["calls"].as_u64().unwrap_or_else(|| panic!("no calls: {writer}"));
        assert!(calls >= 12, "{writer}");
        assert!((1..=calls).contains(&commits), "{writer}");
        if cfg!(target_os = "linux") {
            // The writer thread's CPU time: some, and no more than the run lasted.
            let cpu_us = writer["cpu_us"]
                .as_u64()
                .unwrap_or_else(|| panic!("no cpu_us: {writer}"));
            let elapsed_us = report["elapsed_ms"].as_f64().unwrap() * 1000.0;
            assert!(
                cpu_us > 0 && cpu_us as f64 <= elapsed_us + 1000.0,
                "{writer} over {elapsed_us} µs"
            );
        }
    }
    let plans: Value = serde_json::from_str(&db.ok(&["plan", "list", "--json"])).unwrap();
    assert_eq!(plans.as_array().unwrap().len(), 24);
}

#[test]
fn bench_baseline_runs_the_raw_two_transaction_loop_before_and_after_and_reports_the_ratio() {
    let db = Db::new();
    let out = db.ok(&[
        "bench",
        "--attempts",
        "40",
        "--workers",
        "2",
        "--batch",
        "1",
        "--baseline",
    ]);
    let raw = figure(&out, "raw baseline");
    let rates: Vec<f64> = raw
        .split(" jobs/s")
        .next()
        .unwrap()
        .split(" / ")
        .map(|v| v.parse().unwrap_or_else(|e| panic!("{v:?}: {e}\n{out}")))
        .collect();
    assert_eq!(rates.len(), 2, "{out}");
    assert!(rates.iter().all(|r| *r > 0.0), "{out}");
    assert!(
        raw.contains("(2 plain-SQL workers on sqlite: claim, then token-checked complete)"),
        "{out}"
    );
    let ratio: f64 = figure(&out, "deliveries / raw")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(ratio > 0.0, "{out}");
    assert!(out.contains("exactly once              ok: 40 attempts"), "{out}");

    let report: Value =
        serde_json::from_str(&db.ok(&["bench", "--attempts", "12", "--workers", "3", "--baseline", "--json"])).unwrap();
    let baseline = &report["baseline"];
    assert_eq!(baseline["backend"], "sqlite");
    let mut per_s = Vec::new();
    for run in [&baseline["before"], &baseline["after"]] {
        assert_eq!(run["kind"], "claim-then-complete");
        assert_eq!(run["workers"], 3);
        assert_eq!(run["jobs"], 12);
        per_s.push(12.0 / (run["elapsed_ms"].as_f64().unwrap() / 1_000.0));
    }
    let expected = report["deliveries_per_s"].as_f64().unwrap() / ((per_s[0] + per_s[1]) / 2.0);
    let ratio = baseline["ratio"].as_f64().unwrap();
    assert!((ratio - expected).abs() <= 1e-6 * expected, "{ratio} vs {expected}");
}

#[test]
fn bench_refuses_zero_attempts_as_bad_input() {
    let db = Db::new();
    let out = db.run(&["bench", "--attempts", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "error: --attempts: must be at least 1"
    );
}

/// On MySQL or MariaDB the bench reads the server's own counters around the
/// deliveries. Needs `LEASEHOLD_TEST_MYSQL_URL`; without it the test says it is
/// skipped and passes.
#[test]
fn bench_on_mysql_reports_what_the_server_did_per_delivery() {
    let Ok(admin) = std::env::var("LEASEHOLD_TEST_MYSQL_URL") else {
        println!("skipped: LEASEHOLD_TEST_MYSQL_URL is not set (e.g. mysql://root@127.0.0.1:3306/test)");
        return;
    };
    let admin = leasehold::ledger::mysql::MysqlUrl::parse(&admin).expect("LEASEHOLD_TEST_MYSQL_URL");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let scratch = rt
        .block_on(leasehold::ledger::mysql::scratch::ScratchDatabase::create(
            &admin,
            "lh_bench_",
        ))
        .expect("create a test database");
    let out = Command::new(BIN)
        .arg("--db")
        .arg(scratch.url().expose())
        .args(["bench", "--attempts", "30", "--workers", "2", "--batch", "1", "--json"])
        .env_remove("LEASEHOLD_DB")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verified"]["exactly_once"], 30);
    assert!(report.get("writer").is_none(), "MySQL has no SQLite writer thread");
    let server = &report["server"];
    let count = |k: &str| server[k].as_u64().unwrap_or_else(|| panic!("no {k}: {server}"));
    assert!(!server["version"].as_str().unwrap().is_empty(), "{server}");
    // Every delivery's ending write commits (with the next claim); claims and empty
    // polls add more.
    assert!(count("commits") >= 30, "{server}");
    assert!(count("statements") > count("commits"), "{server}");
    // A claim updates the command, the attempt and the receipt; so does the ending write.
    assert!(count("rows_updated") >= 6 * 30, "{server}");
    assert!(count("rows_read") >= count("rows_updated"), "{server}");
    assert!(count("window_ms") > 0, "{server}");
    if let Some(cpu) = server["cpu_ms"].as_u64() {
        let cores = count("machine_cores");
        assert!(cpu <= count("window_ms") * cores + 50, "{server}");
    }
    let text = Command::new(BIN)
        .arg("--db")
        .arg(scratch.url().expose())
        .args(["bench", "--attempts", "10", "--workers", "1"])
        .env_remove("LEASEHOLD_DB")
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        figure(&text, "server").contains(" statements, ") && figure(&text, "server").contains(" commits, "),
        "{text}"
    );
}
