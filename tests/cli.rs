//! End-to-end tests of the `leasehold` binary: the demo, crashes (SIGKILL), pauses
//! (SIGSTOP) past the lease, one-line errors with their exit codes, the plan's
//! `[retry]` table, scheduled enqueues, exhaustion by deadline, and bulk recovery
//! (`retry --failed`, `abort --open`).
//!
//! Processes are synchronised on what they print (a line read from a pipe), never on
//! sleeps; timeouts only bound how long a test may hang before it fails.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
const WAIT: Duration = Duration::from_secs(60);

struct Db {
    dir: tempfile::TempDir,
    url: String,
}

impl Db {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let db = Db { dir, url };
        let out = db.run(&["migrate"]);
        assert!(
            out.status.success(),
            "migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        db
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.arg("--db").arg(&self.url).args(args).env_remove("LEASEHOLD_DB");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
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

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        serde_json::from_str(&self.ok(&all)).unwrap()
    }

    fn add_plan(&self, file: &str) -> String {
        let out = self.ok(&["plan", "add", fixture(file).to_str().unwrap()]);
        out.split_whitespace().next().unwrap().to_owned()
    }

    /// Writes `text` to the plan file `name` beside the ledger; answers its path.
    fn plan_file(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }

    /// Registers a one-step dry-run plan `name` with `extra` TOML after its head
    /// (a `[retry]` table) and `payload` for its step; answers the plan id.
    fn dry_plan(&self, name: &str, extra: &str, payload: &str) -> String {
        let text = format!(
            "name = \"{name}\"\nrecovery = \"resume\"\n{extra}\n[[steps]]\ncode = \"a\"\nexecutor = \"dry-run:v1\"\npayload = {payload}\n"
        );
        let out = self.ok(&["plan", "add", &self.plan_file(&format!("{name}.toml"), &text)]);
        out.split_whitespace().next().unwrap().to_owned()
    }

    /// Enqueues `plan` with `extra` flags; answers the attempt id.
    fn enqueue(&self, plan: &str, extra: &[&str]) -> String {
        let mut args = vec!["enqueue", plan];
        args.extend_from_slice(extra);
        self.ok(&args).trim().to_owned()
    }

    fn worker(&self, id: &str, extra: &[&str]) -> Worker {
        let mut args = vec!["worker", "--id", id, "--lease-secs", "2", "--poll-secs", "1"];
        args.extend_from_slice(extra);
        let mut child = self
            .cmd(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }
}

struct Worker {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Worker {
    /// Reads the worker's output until a line contains `needle`.
    fn wait_for(&mut self, needle: &str) -> String {
        self.wait_for_any(&[needle])
    }

    /// Reads the worker's output until a line contains one of `needles`.
    fn wait_for_any(&mut self, needles: &[&str]) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if needles.iter().any(|needle| line.contains(needle)) {
                        return line;
                    }
                }
                Err(_) => panic!("no line containing any of {needles:?}; saw:\n{}", self.seen.join("\n")),
            }
        }
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit and returns everything it printed.
    fn finish(mut self) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
                    self.seen.push(line);
                }
                let _ = status;
                return std::mem::take(&mut self.seen);
            }
            assert!(
                Instant::now() < deadline,
                "worker did not exit; saw:\n{}",
                self.seen.join("\n")
            );
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(100)) {
                self.seen.push(line);
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/plans").join(name)
}

fn receipts(status: &Value) -> &Vec<Value> {
    status["receipts"].as_array().unwrap()
}

#[test]
fn demo_delivers_both_attempts_with_six_succeeded_receipts() {
    let db = Db::new();
    let out = db.ok(&["demo"]);
    let attempts: Vec<String> = out
        .lines()
        .filter_map(|l| l.strip_prefix("enqueued attempt "))
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect();
    assert_eq!(attempts.len(), 2, "{out}");
    assert!(out.contains("step 6/6 verify-integrity: succeeded"), "{out}");
    for id in &attempts {
        let status = db.json(&["status", id]);
        assert_eq!(status["attempt"]["status"], "SUCCEEDED");
        assert_eq!(status["command"]["status"], "DELIVERED");
        assert_eq!(receipts(&status).len(), 6);
        assert!(receipts(&status).iter().all(|r| r["status"] == "SUCCEEDED"));
    }
}

#[test]
fn sigkill_mid_attempt_then_another_worker_resumes_with_the_same_key() {
    let db = Db::new();
    let plan = db.add_plan("dry-run.toml");
    let attempt = db.ok(&["enqueue", &plan]).trim().to_owned();
    let mut first = db.worker("first", &[]);
    first.wait_for("step 2/5 reserve-capacity: running");
    first.signal("KILL");
    drop(first);
    let before = db.json(&["status", &attempt]);
    assert_eq!(before["receipts"][0]["status"], "SUCCEEDED");
    assert_eq!(before["receipts"][1]["status"], "RUNNING");

    let mut second = db.worker("second", &["--until-idle"]);
    let claimed = second.wait_for("claimed attempt");
    assert!(
        claimed.contains("delivery 2") && claimed.contains("1 already succeeded"),
        "{claimed}"
    );
    second.finish();

    let after = db.json(&["status", &attempt]);
    assert_eq!(after["attempt"]["status"], "SUCCEEDED");
    assert_eq!(after["command"]["status"], "DELIVERED");
    assert_eq!(after["command"]["delivery_count"], 2);
    assert_eq!(after["command"]["lease_owner"], "second");
    // The finished step keeps its receipt; the ambiguous one is redelivered with its key.
    assert_eq!(
        after["receipts"][0]["evidence_sha256"],
        before["receipts"][0]["evidence_sha256"]
    );
    assert_eq!(
        after["receipts"][0]["finished_at"],
        before["receipts"][0]["finished_at"]
    );
    for i in 0..5 {
        assert_eq!(
            after["receipts"][i]["idempotency_key"],
            before["receipts"][i]["idempotency_key"]
        );
        assert_eq!(after["receipts"][i]["status"], "SUCCEEDED");
    }
    let key = before["receipts"][1]["idempotency_key"].as_str().unwrap();
    assert!(after["receipts"][1]["target_receipt"].as_str().unwrap().contains(key));
}

#[test]
fn sigkill_mid_replay_attempt_replays_every_step_into_a_new_sandbox() {
    let db = Db::new();
    let plan = db.add_plan("rehearsal.toml");
    let attempt = db.ok(&["enqueue", &plan]).trim().to_owned();
    let mut first = db.worker("first", &[]);
    first.wait_for("step 3/6");
    first.signal("KILL");
    drop(first);
    let before = db.json(&["status", &attempt]);
    assert_eq!(before["receipts"][0]["status"], "SUCCEEDED");

    let mut second = db.worker("second", &["--until-idle"]);
    let claimed = second.wait_for("claimed attempt");
    assert!(
        claimed.contains("delivery 2") && !claimed.contains("already succeeded"),
        "{claimed}"
    );
    let lines = second.finish();
    let replayed = lines
        .iter()
        .filter(|l| l.contains(": succeeded") && l.contains(&attempt))
        .count();
    assert_eq!(replayed, 6, "all six steps replayed:\n{}", lines.join("\n"));

    let after = db.json(&["status", &attempt]);
    assert_eq!(after["attempt"]["status"], "SUCCEEDED");
    assert_eq!(after["command"]["delivery_count"], 2);
    let old_sandbox = before["receipts"][0]["evidence"].as_str().unwrap().to_owned();
    for r in receipts(&after) {
        assert_eq!(r["status"], "SUCCEEDED");
        let evidence: Value = serde_json::from_str(r["evidence"].as_str().unwrap()).unwrap();
        let sandbox = evidence["sandbox_id"].as_str().unwrap();
        assert!(
            sandbox.ends_with("d2"),
            "step replayed in the second delivery's sandbox: {sandbox}"
        );
        assert!(!old_sandbox.contains(sandbox));
    }
}

#[test]
fn a_paused_worker_past_its_lease_writes_nothing_after_a_takeover() {
    let db = Db::new();
    let plan = db.add_plan("dry-run.toml");
    let attempt = db.ok(&["enqueue", &plan]).trim().to_owned();
    let mut paused = db.worker("paused", &[]);
    paused.wait_for("step 2/5 reserve-capacity: running");
    paused.signal("STOP");

    let mut taker = db.worker("taker", &["--until-idle"]);
    taker.wait_for("claimed attempt");
    taker.finish();
    let delivered = db.json(&["status", &attempt]);
    assert_eq!(delivered["command"]["status"], "DELIVERED");
    assert_eq!(delivered["command"]["lease_owner"], "taker");

    paused.signal("CONT");
    // Resumed long past its lease, the paused worker ends the delivery without a
    // write: its driver abandons the command before sending anything (its lease
    // estimate lapsed while it was stopped), or, if a request was already on its way
    // when it stopped, the ledger refuses it. Which one depends on where the stop
    // landed, not on what the resumed process happens to notice first.
    let ended = paused.wait_for_any(&[
        &format!("attempt {attempt}: write refused"),
        &format!("attempt {attempt}: abandoned: lease not renewed"),
        &format!("attempt {attempt}: delivered"),
        &format!("attempt {attempt}: failed"),
    ]);
    assert!(
        ended.contains("write refused") || ended.contains("abandoned"),
        "the paused worker's delivery ended with a write: {ended}"
    );
    paused.signal("TERM");
    paused.finish();

    let after = db.json(&["status", &attempt]);
    assert_eq!(after, delivered, "the paused worker changed nothing");
}

fn expect_error(out: &Output, code: i32, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in: {stderr}");
}

#[test]
fn bad_plan_files_are_refused_by_name_and_write_nothing() {
    let db = Db::new();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "unknown-exec.toml",
            "name = \"p\"\nrecovery = \"resume\"\n[[steps]]\ncode = \"a\"\nexecutor = \"nope:v1\"\n",
            "steps[0].executor: unknown executor \"nope:v1\"",
        ),
        (
            "no-steps.json",
            r#"{"name": "p", "recovery": "resume", "steps": []}"#,
            "steps: a plan needs at least one step",
        ),
        (
            "extra.json",
            r#"{"name": "p", "recovery": "resume", "stepz": []}"#,
            "unknown field `stepz`",
        ),
        (
            "recovery.toml",
            "name = \"p\"\nrecovery = \"rewind\"\n[[steps]]\ncode = \"a\"\nexecutor = \"dry-run:v1\"\n",
            "recovery: \"rewind\" is not a recovery mode",
        ),
        ("broken.toml", "name = \"p\"\nrecovery = \n", "line 2"),
    ];
    for (name, text, needle) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = db.run(&["plan", "add", path.to_str().unwrap()]);
        expect_error(&out, 2, needle);
        assert!(String::from_utf8_lossy(&out.stderr).contains(name));
    }
    let out = db.run(&["plan", "add", dir.path().join("missing.toml").to_str().unwrap()]);
    expect_error(&out, 2, "missing.toml");
    assert_eq!(db.json(&["plan", "list"]), serde_json::json!([]));
}

#[test]
fn unknown_ids_and_bad_urls_get_one_line_errors() {
    let db = Db::new();
    expect_error(&db.run(&["status", "att-nope"]), 2, "attempt att-nope not found");
    expect_error(&db.run(&["history", "no-such-plan"]), 2, "plan no-such-plan not found");
    expect_error(&db.run(&["enqueue", "no-such-plan"]), 2, "plan no-such-plan not found");
    expect_error(&db.run(&["abort", "att-nope"]), 2, "attempt att-nope not found");
    expect_error(&db.run(&["reconcile", "att-nope"]), 2, "attempt att-nope not found");
    let out = Command::new(BIN)
        .args(["--db", "redis://u:hunter2@h/db", "plan", "list"])
        .output()
        .unwrap();
    expect_error(&out, 2, "unsupported scheme \"redis\"");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("hunter2"));
    // Nothing listens on port 1: the server is unavailable, named without its password.
    let out = Command::new(BIN)
        .args([
            "--db",
            "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout_ms=2000",
            "plan",
            "list",
        ])
        .output()
        .unwrap();
    expect_error(
        &out,
        1,
        "ledger unavailable: postgres at postgres://u:***@127.0.0.1:1/db",
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("hunter2"));
    let out = Command::new(BIN)
        .args(["--db", "postgres://u:hunter2@h/db?pool_size=3", "plan", "list"])
        .output()
        .unwrap();
    expect_error(&out, 2, "unknown postgres URL parameter \"pool_size\"");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("hunter2"));
    let out = Command::new(BIN)
        .args(["--db", "not a url", "plan", "list"])
        .output()
        .unwrap();
    expect_error(&out, 2, "--db");
}

#[test]
fn refusals_exit_3_and_change_nothing() {
    let db = Db::new();
    let plan = db.add_plan("dry-run.toml");
    let attempt = db.ok(&["enqueue", &plan]).trim().to_owned();
    expect_error(&db.run(&["enqueue", &plan]), 3, "is still QUEUED");
    expect_error(&db.run(&["enqueue", &plan, "--action", "retry"]), 3, "retry refused");

    let mut worker = db.worker("holder", &[]);
    worker.wait_for("step 1/5");
    let before = db.json(&["status", &attempt]);
    expect_error(&db.run(&["reconcile", &attempt]), 3, "has a live lease held by holder");
    worker.signal("KILL");
    drop(worker);

    let aborted = db.ok(&["abort", &attempt]);
    assert!(aborted.contains("aborted attempt"), "{aborted}");
    let after_abort = db.json(&["status", &attempt]);
    assert_eq!(after_abort["attempt"]["status"], "ABORTED");
    assert_ne!(before, after_abort);
    expect_error(&db.run(&["abort", &attempt]), 3, "is already ABORTED");
    let unchanged = db.ok(&["reconcile", &attempt]);
    assert!(
        unchanged.contains("left attempt") && unchanged.contains("ABORTED"),
        "{unchanged}"
    );
    assert_eq!(db.json(&["status", &attempt]), after_abort);
}

#[test]
fn reconcile_requeues_an_expired_lease() {
    let db = Db::new();
    let plan = db.add_plan("dry-run.toml");
    let attempt = db.ok(&["enqueue", &plan]).trim().to_owned();
    let mut worker = db.worker("crashed", &[]);
    worker.wait_for("step 1/5");
    worker.signal("KILL");
    drop(worker);
    // Poll the ledger until the 2 s lease has expired by its own clock.
    let deadline = Instant::now() + WAIT;
    let out = loop {
        let out = db.run(&["reconcile", &attempt]);
        if out.status.code() != Some(3) {
            break out;
        }
        assert!(Instant::now() < deadline, "lease never expired");
        std::thread::park_timeout(Duration::from_millis(200));
    };
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("requeued attempt"));
    let status = db.json(&["status", &attempt]);
    assert_eq!(status["attempt"]["status"], "QUEUED");
    assert_eq!(status["command"]["status"], "PENDING");
}

#[test]
fn gate_passes_after_the_demo_and_blocks_with_exit_4_without_an_attempt() {
    let db = Db::new();
    let demo = db.ok(&["demo"]);
    assert!(demo.contains("PASS"), "the demo ends with a passing gate:\n{demo}");
    let gate = db.ok(&["gate", "rehearsal"]);
    assert!(gate.contains("PASS") && gate.contains("matches-baseline"), "{gate}");
    let json = db.json(&["gate", "rehearsal"]);
    assert_eq!(json["verdict"], "PASS", "{json}");
    let compare = db.json(&["compare", "rehearsal"]);
    assert_eq!(compare["verdict"], "EQUAL", "{compare}");

    let plan = db.add_plan("dry-run.toml");
    let out = db.run(&["gate", &plan]);
    assert_eq!(out.status.code(), Some(4), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("BLOCK"));
    expect_error(&db.run(&["compare", &plan]), 2, "fewer than two successful attempts");
}

#[test]
fn status_never_shows_the_lease_token() {
    let db = Db::new();
    let plan = db.add_plan("dry-run.toml");
    let attempt = db.ok(&["enqueue", &plan]).trim().to_owned();
    let mut worker = db.worker("holder", &[]);
    worker.wait_for("step 1/5");
    let path = db.url.strip_prefix("sqlite://").unwrap();
    let conn = rusqlite::Connection::open(path).unwrap();
    let token: String = conn
        .query_row(
            "SELECT lease_token FROM command WHERE attempt_id = ?1",
            [&attempt],
            |r| r.get(0),
        )
        .unwrap();
    assert!(token.len() >= 16);
    let text = db.ok(&["status", &attempt]);
    let json = db.ok(&["status", &attempt, "--json"]);
    let history = db.ok(&["history", &plan, "--json"]);
    assert!(text.contains("PROCESSING") && text.contains("holder"), "{text}");
    for out in [&text, &json, &history] {
        assert!(!out.contains(&token), "the lease token leaked:\n{out}");
        assert!(!out.contains("lease_token"), "{out}");
    }
    worker.signal("KILL");
}

#[test]
fn sigterm_stops_claiming_and_lets_the_delivery_in_flight_finish() {
    let db = Db::new();
    let plan = db.add_plan("dry-run.toml");
    let attempt = db.ok(&["enqueue", &plan]).trim().to_owned();
    let mut worker = db.worker("draining", &["--grace-secs", "60"]);
    worker.wait_for("step 1/5");
    worker.signal("TERM");
    worker.wait_for("stopping: no new claims; 1 deliveries in flight");
    // Enqueued after the stop request: must not be claimed by this worker.
    let other = db.add_plan("rehearsal.toml");
    let late = db.ok(&["enqueue", &other]).trim().to_owned();
    let lines = worker.finish();
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("attempt {attempt}: delivered"))),
        "{}",
        lines.join("\n")
    );
    assert!(
        lines.iter().all(|l| !l.contains(&late)),
        "claimed after the stop:\n{}",
        lines.join("\n")
    );
    assert_eq!(db.json(&["status", &attempt])["command"]["status"], "DELIVERED");
    assert_eq!(db.json(&["status", &late])["command"]["status"], "PENDING");
}

#[test]
fn a_grace_period_that_runs_out_leaves_the_lease_to_expire() {
    let db = Db::new();
    let plan = db.add_plan("dry-run.toml");
    let attempt = db.ok(&["enqueue", &plan]).trim().to_owned();
    let mut worker = db.worker("impatient", &["--grace-secs", "0"]);
    worker.wait_for("step 1/5");
    worker.signal("INT");
    let lines = worker.finish();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("grace period over: dropped 1 deliveries")),
        "{}",
        lines.join("\n")
    );
    let status = db.json(&["status", &attempt]);
    assert_eq!(
        status["command"]["status"], "PROCESSING",
        "left for another worker to take over"
    );
}

/// The millisecond fields of a status: (created_at, available_at).
fn times(status: &Value) -> (i64, i64) {
    (
        status["attempt"]["created_at"].as_i64().unwrap(),
        status["command"]["available_at"].as_i64().unwrap(),
    )
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

#[test]
fn retry_tables_are_checked_by_field_and_absurd_values_are_clamped() {
    let db = Db::new();
    let step = "[[steps]]\ncode = \"a\"\nexecutor = \"dry-run:v1\"\n";
    let head = "name = \"p\"\nrecovery = \"resume\"\n";
    let cases = [
        (
            "zero.toml",
            format!("{head}[retry]\nmax_deliveries = 0\n{step}"),
            "retry.max_deliveries: must be at least 1 (got 0)",
        ),
        (
            "negative.toml",
            format!("{head}{step}[steps.retry]\nbackoff_base_ms = -5\n"),
            "steps[0].retry.backoff_base_ms: must be at least 1 (got -5)",
        ),
        (
            "negative.json",
            r#"{"name": "p", "recovery": "resume", "retry": {"deadline_secs": -1},
                "steps": [{"code": "a", "executor": "dry-run:v1"}]}"#
                .to_owned(),
            "retry.deadline_secs: must be at least 1 (got -1)",
        ),
        (
            "inverted.toml",
            format!("{head}[retry]\nbackoff_base_ms = 5000\nbackoff_max_ms = 1000\n{step}"),
            "retry.backoff_base_ms: 5000 is more than backoff_max_ms (1000)",
        ),
        (
            "typo.toml",
            format!("{head}[retry]\nmax_delivery = 3\n{step}"),
            "unknown field `max_delivery`",
        ),
    ];
    for (name, text, needle) in &cases {
        let out = db.run(&["plan", "add", &db.plan_file(name, text)]);
        expect_error(&out, 2, needle);
        assert!(String::from_utf8_lossy(&out.stderr).contains(name));
    }
    assert_eq!(db.json(&["plan", "list"]), serde_json::json!([]), "nothing registered");

    // Absurd values are stored clamped to their bounds, and shown as applied.
    let absurd = format!(
        "{head}[retry]\nmax_deliveries = 99999999999\nbackoff_max_ms = 99999999999999\n\
         {step}[steps.retry]\nstep_max_tries = 1000000\ndeadline_secs = 9223372036854775807\n"
    );
    db.ok(&["plan", "add", &db.plan_file("absurd.toml", &absurd)]);
    let plan = db.json(&["plan", "show", "p"]);
    assert_eq!(
        plan["retry"],
        serde_json::json!({"max_deliveries": 10_000, "backoff_max_ms": 604_800_000_u64}),
        "{plan}"
    );
    assert_eq!(
        plan["steps"][0]["retry"],
        serde_json::json!({"step_max_tries": 100, "deadline_secs": 366 * 86_400}),
        "{plan}"
    );
    let shown = db.ok(&["plan", "show", "p"]);
    assert!(
        shown.contains(
            "retry       at most 10000 deliveries, backoff 1000 to 604800000 ms, 3 tries per delivery, no deadline"
        ),
        "{shown}"
    );
    assert!(
        shown.contains("1. a (dry-run:v1) retry: at most 10000 deliveries, backoff 1000 to 604800000 ms, 100 tries per delivery, deadline 31622400 s after enqueue"),
        "{shown}"
    );
}

#[test]
fn enqueue_at_or_in_schedules_the_first_delivery_and_bad_values_name_the_flag() {
    let db = Db::new();
    let plan = db.dry_plan("later", "", "{ delay_ms = 0 }");
    let bad: [(&[&str], &str); 6] = [
        (
            &["--in", "10"],
            "error: --in \"10\": not a duration such as 500ms, 30s, 10m or 1h",
        ),
        (&["--in", "-5m"], "error: --in \"-5m\": not a duration"),
        (&["--in", "400d"], "error: --in \"400d\": more than 366 days ahead"),
        (&["--at", "tomorrow"], "error: --at \"tomorrow\": not an RFC 3339 time"),
        (
            &["--at", "2026-05-01 09:00"],
            "error: --at \"2026-05-01 09:00\": not an RFC 3339 time",
        ),
        (&["--at", "9999-01-01T00:00:00Z"], "more than 366 days ahead"),
    ];
    for (flags, needle) in bad {
        let mut args = vec!["enqueue", plan.as_str()];
        args.extend_from_slice(flags);
        expect_error(&db.run(&args), 2, needle);
    }
    let both = db.run(&["enqueue", &plan, "--in", "1m", "--at", "2020-01-01T00:00:00Z"]);
    assert_eq!(both.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used with"));
    assert_eq!(db.json(&["history", &plan]), serde_json::json!([]), "nothing enqueued");

    // --in: available exactly that long after the enqueue, shown as scheduled.
    let later = db.enqueue(&plan, &["--in", "1h"]);
    let status = db.json(&["status", &later]);
    let (created, available) = times(&status);
    assert_eq!(available - created, 3_600_000, "{status}");
    let text = db.ok(&["status", &later]);
    assert!(
        text.contains("next delivery   ") && text.contains(", scheduled)"),
        "{text}"
    );
    db.ok(&["abort", &later]);

    // --at in the past: at once.
    let past = db.enqueue(&plan, &["--at", "2001-02-03T04:05:06Z"]);
    let (created, available) = times(&db.json(&["status", &past]));
    assert_eq!(available, created);
    assert!(!db.ok(&["status", &past]).contains("next delivery"));
    db.ok(&["abort", &past]);

    // --at with an offset: that instant, two days from now.
    let at = (now_ms() / 1_000 + 2 * 86_400) * 1_000;
    let local = leasehold::engine::Timestamp::from_millis(at + 7_200_000).to_rfc3339();
    let spelled = local.replace(".000Z", "+02:00");
    let future = db.enqueue(&plan, &["--at", &spelled]);
    assert_eq!(times(&db.json(&["status", &future])).1, at, "{spelled}");
    db.ok(&["abort", &future]);

    // A start 1.5 s ahead: the worker delivers it, no sooner.
    let soon = db.enqueue(&plan, &["--in", "1500ms"]);
    db.ok(&["worker", "--until-idle", "--poll-secs", "1"]);
    let status = db.json(&["status", &soon]);
    assert_eq!(status["attempt"]["status"], "SUCCEEDED", "{status}");
    let started = status["attempt"]["started_at"].as_i64().unwrap();
    assert!(started >= times(&status).1, "claimed before its start: {status}");
}

#[test]
fn an_attempt_past_its_deadline_ends_failed_exhausted_and_is_retried_by_reason() {
    let db = Db::new();
    let plan = db.dry_plan("deadline", "[retry]\ndeadline_secs = 1", "{ delay_ms = 0 }");
    // Not claimable before 1.5 s, and due within 1 s: the claim ends it.
    let late = db.enqueue(&plan, &["--in", "1500ms"]);
    db.ok(&["worker", "--until-idle", "--poll-secs", "1"]);
    let status = db.json(&["status", &late]);
    assert_eq!(status["attempt"]["status"], "FAILED", "{status}");
    let error = status["attempt"]["error"].as_str().unwrap();
    assert!(error.starts_with("exhausted: deadline"), "{error}");
    assert_eq!(status["command"]["status"], "FAILED");
    assert_eq!(status["command"]["delivery_count"], 0, "never delivered");
    assert_eq!(status["command"]["last_error"].as_str(), Some(error));
    let text = db.ok(&["status", &late]);
    assert!(text.contains("error       exhausted: deadline"), "{text}");
    assert!(text.contains("delivery count  0 (at most 25)"), "{text}");

    assert_eq!(
        db.json(&["retry", "--failed", "--reason", "exhausted", "--dry-run"]),
        serde_json::json!({"count": 1})
    );
    let outcome = db.json(&["retry", "--failed", "--reason", "exhausted"]);
    assert_eq!(
        (&outcome["count"], &outcome["more"]),
        (&serde_json::json!(1), &serde_json::json!(false))
    );
    let retry = outcome["attempts"][0].as_str().unwrap();
    db.ok(&["worker", "--until-idle", "--poll-secs", "1"]);
    let status = db.json(&["status", retry]);
    assert_eq!(
        (&status["attempt"]["action"], &status["attempt"]["status"]),
        (&"retry".into(), &"SUCCEEDED".into())
    );
}

#[test]
fn retry_failed_and_abort_open_act_in_bulk_through_the_ledger() {
    let db = Db::new();
    let boom1 = db.dry_plan("boom-1", "", "{ fail = \"boom one\" }");
    let boom2 = db.dry_plan("boom-2", "", "{ fail = \"boom two\" }");
    let fine = db.dry_plan("fine", "", "{ delay_ms = 0 }");
    let failed1 = db.enqueue(&boom1, &[]);
    let failed2 = db.enqueue(&boom2, &[]);
    let done = db.enqueue(&fine, &[]);
    db.ok(&["worker", "--until-idle", "--poll-secs", "1"]);
    for (attempt, status) in [(&failed1, "FAILED"), (&failed2, "FAILED"), (&done, "SUCCEEDED")] {
        assert_eq!(db.json(&["status", attempt])["attempt"]["status"], status);
    }

    // No filter: the library refuses, nothing is written. Filters need the bulk form.
    let needle = "a bulk action needs a filter: a plan, a reason or a since";
    expect_error(&db.run(&["retry", "--failed"]), 2, needle);
    expect_error(&db.run(&["abort", "--open", "--dry-run", "--limit", "5"]), 2, needle);
    for args in [
        &["retry", "--plan", "boom-1"][..],
        &["retry", &failed1, "--failed", "--plan", "boom-1"],
        &["abort", &done, "--open", "--plan", "fine"],
        &["abort", "--open", "--plan", "fine", "--reason", "why"],
        &["retry"],
    ] {
        let out = db.run(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Dry runs count, and write nothing.
    let count = |args: &[&str]| db.json(args)["count"].as_u64().unwrap();
    assert_eq!(count(&["retry", "--failed", "--reason", "boom", "--dry-run"]), 2);
    assert_eq!(count(&["retry", "--failed", "--plan", "boom-2", "--dry-run"]), 1);
    assert_eq!(
        count(&["retry", "--failed", "--reason", "no such error", "--dry-run"]),
        0
    );
    assert_eq!(
        count(&["retry", "--failed", "--since", "2999-01-01T00:00:00Z", "--dry-run"]),
        0
    );
    let text = db.ok(&["retry", "--failed", "--since", "1970-01-01T00:00:00Z", "--dry-run"]);
    assert!(
        text.starts_with("2 failed attempts would be retried (dry run"),
        "{text}"
    );
    assert_eq!(db.json(&["history", &boom1]).as_array().unwrap().len(), 1);

    // A real run, one at a time: the newest first, then the rest.
    let first = db.json(&["retry", "--failed", "--reason", "boom", "--limit", "1"]);
    assert_eq!((&first["count"], &first["more"]), (&1.into(), &true.into()), "{first}");
    assert_eq!(first["refused"], serde_json::json!([]));
    let rest = db.ok(&["retry", "--failed", "--reason", "boom"]);
    assert!(
        rest.starts_with("retried 1 failed attempt; the new attempts:\n  att-"),
        "{rest}"
    );
    for plan in [&boom1, &boom2] {
        let history = db.json(&["history", plan]);
        assert_eq!(history[1]["attempt"]["action"], "retry", "{history}");
        assert_eq!(history[1]["attempt"]["status"], "QUEUED", "{history}");
    }
    // Only its plan's latest attempt, FAILED or ABORTED, is retried one by one.
    expect_error(&db.run(&["retry", &failed1]), 3, "is not the latest attempt of plan");
    expect_error(&db.run(&["retry", &done]), 3, "is SUCCEEDED, not FAILED or ABORTED");

    // Abort the open ones: named after the OS user, or `cli`.
    assert_eq!(
        count(&["abort", "--open", "--since", "1970-01-01T00:00:00Z", "--dry-run"]),
        2
    );
    let out = db
        .cmd(&["abort", "--open", "--plan", "boom-1"])
        .env("USER", "tester")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("aborted 1 open attempt:\n  att-"), "{text}");
    let aborted = db.json(&["history", &boom1])[1].clone();
    assert_eq!(aborted["attempt"]["status"], "ABORTED");
    assert_eq!(aborted["attempt"]["error"], "aborted in bulk by tester");
    let out = db
        .cmd(&["abort", "--open", "--since", "1970-01-01T00:00:00Z", "--json"])
        .env("USER", "two words")
        .env_remove("LOGNAME")
        .output()
        .unwrap();
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&outcome["count"], &outcome["more"]),
        (&1.into(), &false.into()),
        "{outcome}"
    );
    let other = db.json(&["status", outcome["attempts"][0].as_str().unwrap()]);
    assert_eq!(other["attempt"]["plan_id"], boom2.as_str());
    assert_eq!(other["attempt"]["error"], "aborted in bulk by cli");

    // An aborted attempt is retried by its id.
    let id = aborted["attempt"]["id"].as_str().unwrap();
    let retried = db.ok(&["retry", id]);
    assert!(
        retried.starts_with(&format!("retrying attempt {id}: enqueued retry attempt att-")),
        "{retried}"
    );
}
