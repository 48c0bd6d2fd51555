//! The `sqlite-sandbox:v1` memory bound, tried against the real `leasehold` binary:
//! SQL that grows SQLite's heap without bound (temporary tables and sorters kept in
//! memory) fails its step naming the sandbox's memory budget, and the process that
//! ran it — a sandbox child, never the worker — stays within that budget. Also: a
//! stopped step kills its child and the delivery's later steps say why, a dead child
//! fails its step, release ends the child, and a plain rehearsal still delivers.
//!
//! Memory is read from `/proc/<pid>/status` (`VmHWM`, the peak resident set), so
//! these tests run on Linux only. Waits poll a condition up to a deadline.

#![cfg(target_os = "linux")]

use leasehold::executor::sandbox::{MEMORY_BUDGET_BYTES, NAME};
use leasehold::executor::{ExecRequest, Executor, ExecutorResult, SqliteSandbox};
use leasehold_engine::{Action, AttemptId, CommandId, PlanId, Step};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
const WAIT: Duration = Duration::from_secs(90);
/// What a process of the `leasehold` binary (a test build) holds besides SQLite's
/// heap: its code, its allocator's arenas, and the step's JSON.
const BASELINE_BYTES: u64 = 32 * 1024 * 1024;
/// The message of a step that ran out of its sandbox's memory.
const OUT_OF_BUDGET: &str = "exceeded the sandbox memory budget of 64 MiB (sqlite-sandbox:v1)";

/// Heap growth without bound, each through a different kind of temporary storage.
const ATTACKS: &[(&str, &str)] = &[
    (
        "distinct",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(DISTINCT randomblob(1000)) FROM c",
    ),
    (
        "sorter",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT randomblob(1000) FROM c ORDER BY 1",
    ),
    (
        "temp-table",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) \
         SELECT count(*) FROM (SELECT randomblob(1000) AS b FROM c UNION SELECT randomblob(1000) FROM c)",
    ),
];

fn request(attempt: &str, code: &str, payload: Value) -> ExecRequest {
    ExecRequest {
        plan_id: PlanId::new("plan-1"),
        attempt_id: AttemptId::new(attempt),
        command_id: CommandId::new("cmd-1"),
        delivery: 1,
        action: Action::Execute,
        ordinal: 1,
        step: Step {
            code: code.into(),
            executor: NAME.into(),
            target: None,
            payload,
            retry: None,
        },
        idempotency_key: format!("ik-{attempt}-{code}"),
        traceparent: None,
    }
}

fn sql(statements: &[&str]) -> Value {
    json!({"sql": statements, "checks": []})
}

fn permanent(result: ExecutorResult) -> String {
    match result {
        ExecutorResult::Permanent(message) => message,
        other => panic!("expected a permanent failure, got {other:?}"),
    }
}

fn evidence(result: ExecutorResult) -> Value {
    match result {
        ExecutorResult::Done { evidence, .. } => evidence,
        other => panic!("expected done, got {other:?}"),
    }
}

/// A field of `/proc/<pid>/status` in bytes (`VmHWM`, `VmRSS`), or `None` once the
/// process is gone.
fn proc_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(&format!("{field}:")))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Whether `pid` is gone: exited and reaped (a zombie still has its /proc entry).
fn wait_gone(pid: u32) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Whether `pid` has exited (gone, or a zombie whose new parent has yet to reap it):
/// for the children of a worker that ended, which its init process reaps.
fn wait_exited(pid: u32) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat)
                if stat
                    .rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')) =>
            {
                return true
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    false
}

/// The pid of the sandbox child of one delivery, which must be running.
fn child_of(sandbox: &SqliteSandbox, attempt: &str) -> u32 {
    sandbox
        .sandbox_process(&AttemptId::new(attempt), 1)
        .expect("the delivery has a running sandbox child")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heap_growing_sql_fails_naming_the_budget_and_its_child_stays_within_it() {
    let sandbox = SqliteSandbox::isolated(BIN);
    let limit = MEMORY_BUDGET_BYTES + BASELINE_BYTES;
    for (name, attack) in ATTACKS {
        // As a check (read-only) and as a statement: both are bounded.
        for (kind, payload) in [
            ("check", json!({"sql": [], "checks": [{"name": "n", "query": attack}]})),
            ("statement", sql(&[attack])),
        ] {
            let attempt = format!("att-{name}-{kind}");
            let started = Instant::now();
            let message = permanent(sandbox.execute(request(&attempt, "attack", payload)).await);
            assert!(message.contains(OUT_OF_BUDGET), "{name} as a {kind}: {message}");
            assert!(message.starts_with("step attack: "), "{message}");
            let pid = child_of(&sandbox, &attempt);
            let peak = proc_kib(pid, "VmHWM").expect("the child still runs until release");
            println!(
                "{name} as a {kind}: failed after {:?}; the sandbox child's peak RSS {:.1} MiB (limit {:.1} MiB)",
                started.elapsed(),
                mib(peak),
                mib(limit)
            );
            assert!(
                peak <= limit,
                "{name} as a {kind}: the child peaked at {:.1} MiB",
                mib(peak)
            );
            // The sandbox is still usable after the failed step.
            let after = json!({"sql": [], "checks": [{"name": "one", "query": "SELECT 1"}]});
            let mut next = request(&attempt, "after", after);
            next.ordinal = 2;
            assert_eq!(evidence(sandbox.execute(next).await)["checks"]["one"], json!([[1]]));
            sandbox.release(&AttemptId::new(&attempt), 1);
            assert!(wait_gone(pid), "the child {pid} outlived its release");
        }
    }
    assert!(sandbox.open_sandboxes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_database_meets_its_page_cap_within_the_memory_budget() {
    let sandbox = SqliteSandbox::isolated(BIN);
    let fill = sql(&[
        "CREATE TABLE t (b BLOB)",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) INSERT INTO t SELECT randomblob(3000) FROM c",
    ]);
    let message = permanent(sandbox.execute(request("att-full", "fill", fill)).await);
    assert_eq!(message, "step fill: statement sql[1] failed: database or disk is full");
    sandbox.release(&AttemptId::new("att-full"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_share_a_child_answers_repeat_and_release_ends_it() {
    let sandbox = SqliteSandbox::isolated(BIN);
    let create = sql(&["CREATE TABLE t (x)", "INSERT INTO t VALUES (1)"]);
    let first = sandbox.execute(request("att-r", "create", create.clone())).await;
    let pid = child_of(&sandbox, "att-r");
    // The same key again: the same answer, and the table was not created twice.
    assert_eq!(sandbox.execute(request("att-r", "create", create)).await, first);
    let count = json!({"sql": [], "checks": [{"name": "n", "query": "SELECT count(*) FROM t"}]});
    assert_eq!(
        evidence(sandbox.execute(request("att-r", "count", count)).await)["checks"]["n"],
        json!([[1]])
    );
    assert_eq!(child_of(&sandbox, "att-r"), pid, "a second child was started");
    sandbox.release(&AttemptId::new("att-r"), 1);
    assert!(wait_gone(pid), "the child {pid} outlived its release");
    assert_eq!(sandbox.sandbox_process(&AttemptId::new("att-r"), 1), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_step_kills_its_child_and_later_steps_say_why() {
    let sandbox = SqliteSandbox::isolated(BIN);
    evidence(
        sandbox
            .execute(request("att-s", "create", sql(&["CREATE TABLE t (x)"])))
            .await,
    );
    let pid = child_of(&sandbox, "att-s");
    let runaway = sql(&["WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"]);
    let budget = Duration::from_millis(300);
    let outcome = tokio::time::timeout(budget, sandbox.execute(request("att-s", "runaway", runaway))).await;
    assert!(outcome.is_err(), "a query that never ends ended: {outcome:?}");
    assert!(wait_gone(pid), "the child {pid} of a stopped step still runs");
    let message = permanent(sandbox.execute(request("att-s", "next", sql(&["SELECT 1"]))).await);
    assert!(
        message.starts_with("step next: this delivery's sandbox is gone: an earlier step was stopped"),
        "{message}"
    );
    sandbox.release(&AttemptId::new("att-s"), 1);
    // A new delivery starts from a fresh sandbox.
    let mut redelivery = request("att-s", "create", sql(&["CREATE TABLE t (x)"]));
    redelivery.delivery = 2;
    evidence(sandbox.execute(redelivery).await);
    sandbox.release(&AttemptId::new("att-s"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_dies_fails_its_step_and_the_delivery() {
    let sandbox = SqliteSandbox::isolated(BIN);
    evidence(
        sandbox
            .execute(request("att-d", "create", sql(&["CREATE TABLE t (x)"])))
            .await,
    );
    let pid = child_of(&sandbox, "att-d");
    // What the system's OOM killer would do.
    let killed = Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    assert!(killed.success());
    let message = permanent(
        sandbox
            .execute(request("att-d", "insert", sql(&["INSERT INTO t VALUES (1)"])))
            .await,
    );
    assert!(
        message.starts_with("step insert: the sandbox process failed:") && message.contains("SIGKILL"),
        "{message}"
    );
    assert!(wait_gone(pid), "the dead child {pid} was not reaped");
    let message = permanent(sandbox.execute(request("att-d", "again", sql(&["SELECT 1"]))).await);
    assert!(
        message.starts_with("step again: this delivery's sandbox is gone:"),
        "{message}"
    );
    sandbox.release(&AttemptId::new("att-d"), 1);
}

#[tokio::test]
async fn a_program_that_is_no_sandbox_child_is_a_transient_failure() {
    let sandbox = SqliteSandbox::isolated("/bin/true");
    let answer = sandbox.execute(request("att-t", "s", sql(&[]))).await;
    match answer {
        ExecutorResult::Transient(message) => {
            assert!(
                message.starts_with("step s: could not open a sandbox: /bin/true did not open a sandbox"),
                "{message}"
            )
        }
        other => panic!("expected a transient failure, got {other:?}"),
    }
    // Nothing is left behind: a retry would start a child again.
    assert!(sandbox.open_sandboxes().is_empty());
}

/// A SQLite ledger in a temporary directory, driven through the binary.
struct Ledger {
    dir: tempfile::TempDir,
    url: String,
}

impl Ledger {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let ledger = Ledger { dir, url };
        ledger.ok(&["migrate"]);
        ledger
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.arg("--db").arg(&self.url).args(args).env_remove("LEASEHOLD_DB");
        c
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args).output().unwrap();
        assert!(
            out.status.success(),
            "leasehold {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Registers the plan file and enqueues one attempt; answers its id.
    fn enqueue(&self, plan: &Path) -> String {
        let id = self.ok(&["plan", "add", plan.to_str().unwrap()]);
        let id = id.split_whitespace().next().unwrap().to_owned();
        self.ok(&["enqueue", &id]).trim().to_owned()
    }

    fn attempt(&self, attempt: &str) -> Value {
        let status: Value = serde_json::from_str(&self.ok(&["status", attempt, "--json"])).unwrap();
        status["attempt"].clone()
    }
}

/// Peaks seen while a worker ran: its own, and each sandbox child's.
#[derive(Default, Debug)]
struct Peaks {
    worker: u64,
    children: Vec<(u32, u64)>,
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            // pid (comm) state ppid …: the fields after the last ')'.
            let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
            after.split_whitespace().nth(1) == Some(pid.to_string().as_str())
        })
        .collect()
}

/// Runs `leasehold worker --until-idle` to its end, sampling its peak RSS and its
/// children's every few milliseconds.
fn run_worker(ledger: &Ledger) -> Peaks {
    let mut worker = ledger
        .cmd(&["worker", "--id", "w1", "--poll-secs", "1", "--until-idle"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = worker.id();
    let mut peaks = Peaks::default();
    let deadline = Instant::now() + WAIT;
    while worker.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the worker still runs after {WAIT:?}");
        if let Some(peak) = proc_kib(pid, "VmHWM") {
            peaks.worker = peaks.worker.max(peak);
        }
        for child in children_of(pid) {
            let Some(peak) = proc_kib(child, "VmHWM") else { continue };
            match peaks.children.iter_mut().find(|(p, _)| *p == child) {
                Some((_, seen)) => *seen = (*seen).max(peak),
                None => peaks.children.push((child, peak)),
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(worker.wait().unwrap().success());
    peaks
}

#[test]
fn a_worker_fails_the_heap_attack_and_neither_it_nor_its_child_passes_the_budget() {
    let ledger = Ledger::new();
    let plan = ledger.dir.path().join("attack.json");
    let attack = ATTACKS[0].1;
    let spec = json!({
        "name": "heap-attack",
        "recovery": "replay",
        "steps": [{"code": "attack", "executor": NAME,
                   "payload": {"sql": [], "checks": [{"name": "n", "query": attack}]}}],
    });
    std::fs::write(&plan, spec.to_string()).unwrap();
    let attempt = ledger.enqueue(&plan);
    let peaks = run_worker(&ledger);
    let failed = ledger.attempt(&attempt);
    assert_eq!(failed["status"], "FAILED", "{failed:#}");
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains(OUT_OF_BUDGET), "{error}");
    let limit = MEMORY_BUDGET_BYTES + BASELINE_BYTES;
    let child_peak = peaks
        .children
        .iter()
        .map(|(_, peak)| *peak)
        .max()
        .expect("a sandbox child ran");
    println!(
        "worker peak RSS {:.1} MiB; sandbox child peak RSS {:.1} MiB (limit {:.1} MiB each)",
        mib(peaks.worker),
        mib(child_peak),
        mib(limit)
    );
    assert!(
        peaks.worker <= limit,
        "the worker peaked at {:.1} MiB",
        mib(peaks.worker)
    );
    assert!(
        child_peak <= limit,
        "the sandbox child peaked at {:.1} MiB",
        mib(child_peak)
    );
    for (child, _) in peaks.children {
        assert!(wait_exited(child), "the sandbox child {child} outlived its worker");
    }
}

#[test]
fn a_worker_still_delivers_a_rehearsal_through_its_sandbox_children() {
    let ledger = Ledger::new();
    let plan = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/plans/rehearsal.toml");
    let attempt = ledger.enqueue(&plan);
    let peaks = run_worker(&ledger);
    let done = ledger.attempt(&attempt);
    assert_eq!(done["status"], "SUCCEEDED", "{done:#}");
    assert!(!peaks.children.is_empty(), "no sandbox child was seen");
    for (child, _) in peaks.children {
        assert!(wait_exited(child), "the sandbox child {child} outlived its worker");
    }
}

#[test]
fn a_worker_killed_mid_step_leaves_no_sandbox_child_running() {
    let ledger = Ledger::new();
    let plan = ledger.dir.path().join("runaway.json");
    let runaway = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n";
    let spec = json!({
        "name": "runaway",
        "recovery": "replay",
        "steps": [{"code": "spin", "executor": NAME, "payload": {"sql": [runaway], "checks": []}}],
    });
    std::fs::write(&plan, spec.to_string()).unwrap();
    ledger.enqueue(&plan);
    let mut worker = ledger
        .cmd(&["worker", "--id", "w1", "--poll-secs", "1", "--until-idle"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + WAIT;
    let child = loop {
        if let Some(child) = children_of(worker.id()).first() {
            break *child;
        }
        assert!(Instant::now() < deadline, "no sandbox child started");
        std::thread::sleep(Duration::from_millis(10));
    };
    worker.kill().unwrap();
    worker.wait().unwrap();
    // Its stdin closed: the child interrupts its SQL and exits by itself.
    assert!(
        wait_exited(child),
        "the sandbox child {child} outlived its killed worker"
    );
}
