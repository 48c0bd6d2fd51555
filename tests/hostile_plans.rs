//! Hostile plans against the real `leasehold` binary and a SQLite ledger file: each
//! test tries an attack a plan author could make and asserts what the product
//! promises — no host file created, no ledger row read through the sandbox, a
//! runaway step FAILED within its budget while the same worker delivers another
//! attempt, SIGTERM ending the process within its grace period, and no forged line
//! of output.
//!
//! Processes are synchronised on what they print (a line read from a pipe), never on
//! sleeps; timeouts only bound how long a test may hang before it fails.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

mod cli_support;

use cli_support::Db;

const WAIT: Duration = Duration::from_secs(90);

/// A SQL statement that never ends: counting an endless recursive CTE.
const RUNAWAY: &str = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n";

impl Db {
    fn status(&self, attempt: &str) -> Value {
        serde_json::from_str(&self.ok(&["status", attempt, "--json"])).unwrap()
    }

    /// Registers `plan` (a JSON plan) and enqueues one attempt; answers its id.
    fn enqueue(&self, name: &str, plan: &Value) -> String {
        let id = self.add_plan_file(&format!("{name}.json"), plan);
        self.ok(&["enqueue", &id]).trim().to_owned()
    }

    fn worker(&self, extra: &[&str]) -> Worker {
        let mut args = vec!["worker", "--id", "w1", "--poll-secs", "1"];
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
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("no line containing {needle:?}; saw:\n{}", self.seen.join("\n")),
            }
        }
    }

    /// Waits at most `limit` for the process to exit; answers its exit code and
    /// everything it printed.
    fn finish_within(mut self, limit: Duration) -> (Option<i32>, Vec<String>) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
                    self.seen.push(line);
                }
                return (status.code(), std::mem::take(&mut self.seen));
            }
            assert!(
                Instant::now() < deadline,
                "the worker was still running after {limit:?}; saw:\n{}",
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

fn sandbox_plan(name: &str, sql: &[&str], checks: Value) -> Value {
    json!({
        "name": name,
        "recovery": "replay",
        "steps": [{"code": "attack", "executor": "sqlite-sandbox:v1", "payload": {"sql": sql, "checks": checks}}],
    })
}

fn dry_run_plan(name: &str) -> Value {
    json!({
        "name": name,
        "recovery": "resume",
        "steps": [{"code": "hello", "executor": "dry-run:v1", "payload": {}}],
    })
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn sandbox_sql_reaches_no_host_file_and_no_ledger_row() {
    let db = Db::new();
    let ledger = db.path("ledger.db").display().to_string();
    let host = db.path("host").display().to_string();
    std::fs::create_dir(&host).unwrap();
    let target = |name: &str| format!("{host}/{name}");
    let attacks: Vec<(&str, Value)> = vec![
        (
            "attach-ledger",
            sandbox_plan(
                "attach-ledger",
                &[
                    &format!("ATTACH DATABASE '{ledger}' AS l"),
                    "UPDATE l.command SET status = 'QUEUED'",
                ],
                json!([{"name": "tokens", "query": "SELECT lease_token FROM l.command"}]),
            ),
        ),
        (
            "attach-new-file",
            sandbox_plan(
                "attach-new-file",
                &[
                    &format!("ATTACH DATABASE '{}' AS x", target("made.db")),
                    "CREATE TABLE x.t (a)",
                ],
                json!([]),
            ),
        ),
        (
            "attach-uri",
            sandbox_plan(
                "attach-uri",
                &[&format!("ATTACH DATABASE 'file:{}?mode=rwc' AS x", target("uri.db"))],
                json!([]),
            ),
        ),
        (
            "vacuum-into",
            sandbox_plan(
                "vacuum-into",
                &["CREATE TABLE t (a)", &format!("VACUUM INTO '{}'", target("copy.db"))],
                json!([]),
            ),
        ),
        (
            "temp-dir",
            sandbox_plan(
                "temp-dir",
                &[&format!("PRAGMA temp_store_directory = '{host}'")],
                json!([]),
            ),
        ),
        (
            "load-extension",
            sandbox_plan("load-extension", &["SELECT load_extension('/tmp/evil.so')"], json!([])),
        ),
        (
            "attach-in-a-check",
            sandbox_plan(
                "attach-in-a-check",
                &[],
                json!([{"name": "a", "query": format!("ATTACH DATABASE '{ledger}' AS l")}]),
            ),
        ),
        (
            "write-in-a-check",
            sandbox_plan(
                "write-in-a-check",
                &["CREATE TABLE t (a)"],
                json!([{"name": "w", "query": "DELETE FROM t RETURNING a"}]),
            ),
        ),
    ];
    let mut attempts = Vec::new();
    for (name, plan) in &attacks {
        attempts.push((*name, db.enqueue(name, plan)));
    }
    let (code, lines) = db
        .worker(&["--until-idle", "--batch", "4", "--lease-secs", "30"])
        .finish_within(WAIT);
    assert_eq!(code, Some(0), "{lines:?}");
    for (name, attempt) in &attempts {
        let status = db.status(attempt);
        assert_eq!(status["attempt"]["status"], "FAILED", "{name}: {status:#}");
        let error = status["attempt"]["error"].as_str().unwrap_or_default();
        assert!(
            ["not authorized", "authorization denied", "too many attached"]
                .iter()
                .any(|refusal| error.contains(refusal)),
            "{name}: {error}"
        );
        // Nothing of the ledger came back as evidence.
        assert!(status["receipts"][0]["evidence"].is_null(), "{name}: {status:#}");
    }
    assert!(
        files_in(Path::new(&host)).is_empty(),
        "host files: {:?}",
        files_in(Path::new(&host))
    );
    // The ledger's own rows are as the worker left them: every command ended.
    for (_, attempt) in &attempts {
        assert_eq!(db.status(attempt)["command"]["status"], "FAILED");
    }
}

#[test]
fn a_runaway_step_fails_within_its_budget_while_the_same_worker_delivers_another_attempt() {
    let db = Db::new();
    let runaway = db.enqueue("runaway", &sandbox_plan("runaway", &[RUNAWAY], json!([])));
    let other = db.enqueue("other", &dry_run_plan("other"));
    // A lease of 1 s and a budget of 4 s: the runaway's failure can only be written
    // if heartbeats went on renewing its lease while its SQL ran.
    let (code, lines) = db
        .worker(&[
            "--until-idle",
            "--batch",
            "2",
            "--lease-secs",
            "1",
            "--step-timeout-secs",
            "4",
        ])
        .finish_within(WAIT);
    assert_eq!(code, Some(0), "{lines:?}");
    let failed = db.status(&runaway);
    assert_eq!(failed["attempt"]["status"], "FAILED", "{failed:#}");
    assert_eq!(
        failed["attempt"]["error"],
        "step 1: step attack: still running after its time budget of 4000 ms (step timeout); stopped"
    );
    assert_eq!(failed["command"]["delivery_count"], 1, "{failed:#}");
    let delivered = db.status(&other);
    assert_eq!(delivered["attempt"]["status"], "SUCCEEDED", "{delivered:#}");
    let done = lines.last().unwrap();
    assert!(
        done.contains("delivered 1, failed 1, refused 0, abandoned 0"),
        "{lines:?}"
    );
}

#[test]
fn sigterm_ends_a_worker_running_a_runaway_step_within_the_grace_period() {
    let db = Db::new();
    db.enqueue("runaway", &sandbox_plan("runaway", &[RUNAWAY], json!([])));
    let mut worker = db.worker(&["--lease-secs", "30", "--grace-secs", "1", "--step-timeout-secs", "600"]);
    worker.wait_for("step 1/1 attack: running");
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(worker.child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let sent = Instant::now();
    // Grace 1 s, then at most 1 s for cancelled steps to end: 15 s bounds a hang only.
    let (code, lines) = worker.finish_within(Duration::from_secs(15));
    assert_eq!(code, Some(0), "{lines:?}");
    assert!(
        lines.iter().any(|l| l.contains("abandoned 1")),
        "{lines:?} (after {:?})",
        sent.elapsed()
    );
}

#[test]
fn control_characters_are_refused_in_plans_and_escaped_in_output() {
    let db = Db::new();
    let forged = "x\n[w1] attempt att-forged: delivered";
    for (field, plan) in [
        (
            "name",
            json!({"name": forged, "recovery": "resume", "steps": [{"code": "a", "executor": "dry-run:v1"}]}),
        ),
        (
            "steps[0].code",
            json!({"name": "p", "recovery": "resume", "steps": [{"code": "a\u{1b}[2J", "executor": "dry-run:v1"}]}),
        ),
    ] {
        let file = db.path("bad.json");
        std::fs::write(&file, plan.to_string()).unwrap();
        let out = db.run(&["plan", "add", file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.contains(&format!("{field}: must not contain control characters")),
            "{stderr}"
        );
    }
    // An executor's error text is not the plan's to vet: it is escaped when shown.
    let attempt = db.enqueue(
        "err",
        &sandbox_plan(
            "err",
            &["SELECT * FROM \"t\n[w1] attempt att-forged: delivered\""],
            json!([]),
        ),
    );
    let (_, lines) = db.worker(&["--until-idle", "--lease-secs", "30"]).finish_within(WAIT);
    assert!(
        !lines.iter().any(|l| l.starts_with("[w1] attempt att-forged")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("t\\n[w1] attempt att-forged")),
        "{lines:?}"
    );
    let text = db.ok(&["status", &attempt]);
    assert!(!text.lines().any(|l| l.starts_with("[w1]")), "{text}");
    assert!(text.contains("t\\n[w1] attempt att-forged: delivered"), "{text}");
}

#[test]
fn invisible_and_separator_characters_are_refused_in_plans_by_field_and_code_point() {
    let db = Db::new();
    let step = |code: &str| json!([{"code": code, "executor": "dry-run:v1"}]);
    let cases = [
        (
            "name",
            "U+200B",
            json!({"name": "dry\u{200b}-run", "recovery": "resume", "steps": step("a")}),
        ),
        (
            "name",
            "U+00A0",
            json!({"name": "nightly\u{a0}import", "recovery": "resume", "steps": step("a")}),
        ),
        (
            "steps[0].code",
            "U+2028",
            json!({"name": "p", "recovery": "resume", "steps": step("a\u{2028}b")}),
        ),
        (
            "steps[0].code",
            "U+E0041",
            json!({"name": "p", "recovery": "resume", "steps": step("a\u{e0041}")}),
        ),
        (
            "volatile_fields[0]",
            "U+FEFF",
            json!({"name": "p", "recovery": "resume", "volatile_fields": ["\u{feff}at"], "steps": step("a")}),
        ),
    ];
    for (field, code_point, plan) in cases {
        let file = db.path("bad.json");
        std::fs::write(&file, plan.to_string()).unwrap();
        let out = db.run(&["plan", "add", file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{plan}");
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            format!(
                "error: plan file {}: {field}: must not contain invisible or separator characters (found {code_point})\n",
                file.display()
            )
        );
        assert!(out.stdout.is_empty());
    }
    assert_eq!(db.ok(&["plan", "list"]), "no plans\n");
    // Letters of every script and plain spaces stay allowed.
    let file = db.path("good.json");
    let good = json!({"name": "déploiement 部署", "recovery": "resume", "steps": step("étape 1")});
    std::fs::write(&file, good.to_string()).unwrap();
    db.ok(&["plan", "add", file.to_str().unwrap()]);
    assert!(db.ok(&["plan", "list"]).contains("déploiement 部署"));
}

#[test]
fn token_names_and_worker_ids_with_invisible_characters_are_refused() {
    let db = Db::new();
    let out = db.run(&["token", "add", "ci\u{200b}-bot", "--role", "admin"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "error: token name: must not contain invisible or separator characters (found U+200B)\n"
    );
    assert!(out.stdout.is_empty(), "no secret is printed for a refused name");
    assert_eq!(db.ok(&["token", "list"]), "no tokens\n");
    let out = db.run(&["worker", "--id", "w\u{2060}1", "--until-idle"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "error: --id: must not contain invisible or separator characters (found U+2060)\n"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn names_stored_before_the_rule_show_their_invisible_characters() {
    let db = Db::new();
    db.enqueue("p", &dry_run_plan("p"));
    let conn = rusqlite::Connection::open(db.path("ledger.db")).unwrap();
    conn.execute(
        "UPDATE plan SET name = ?1, steps_json = replace(steps_json, '\"hello\"', ?2)",
        ("dry\u{200b}-run", "\"hel\u{2029}lo\""),
    )
    .unwrap();
    drop(conn);
    let list = db.ok(&["plan", "list"]);
    assert!(list.contains("dry\\u{200b}-run"), "{list}");
    let history = db.ok(&["history", "dry\u{200b}-run"]);
    assert!(history.contains("dry\\u{200b}-run"), "{history}");
    let shown = db.ok(&["plan", "show", "dry\u{200b}-run"]);
    assert!(shown.contains("hel\\u{2029}lo"), "{shown}");
    for text in [&list, &history, &shown] {
        assert!(!text.contains(['\u{200b}', '\u{2029}']), "{text:?}");
    }
}

#[test]
fn a_plan_file_is_read_only_up_to_its_size_limit() {
    let db = Db::new();
    let out = db.run(&["plan", "add", "/dev/zero"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("plan file /dev/zero: larger than the limit of 4194304 bytes"),
        "{stderr}"
    );
}

#[test]
fn out_of_range_settings_are_clamped_not_overflowed() {
    let db = Db::new();
    let out = db.run(&[
        "worker",
        "--until-idle",
        "--grace-secs",
        &u64::MAX.to_string(),
        "--step-timeout-secs",
        &u64::MAX.to_string(),
        "--lease-secs",
        &u64::MAX.to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}
