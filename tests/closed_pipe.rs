//! A reader that goes away ends every `leasehold` command quietly: `leasehold plan
//! list --json | head -c 10` and the like end with status 141 (128 + SIGPIPE, as
//! `cat` would) and print nothing on stderr — no panic, no backtrace, no message —
//! for reads, writes, a worker and the servers; an error whose stderr is gone still
//! ends with its own status; any other write failure is one line and status 1.
//!
//! Two ways to close the pipe: read a few bytes of an output far larger than a pipe
//! holds and close it (the command is blocked writing when its reader goes), or hand
//! the command a pipe whose reader is already closed (its first write fails, whatever
//! the output's size). Processes are awaited with a bounded deadline, never a sleep.

use serde_json::{json, Value};
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

mod cli_support;

use cli_support::{Db, BIN};

const WAIT: Duration = Duration::from_secs(60);
/// What the shell shows for a process ended by SIGPIPE.
const BROKEN_PIPE: i32 = 141;

impl Db {
    /// Registers `plan`; answers its id.
    fn add_plan(&self, plan: &Value) -> String {
        self.add_plan_file("plan.json", plan)
    }
}

/// `leasehold args`, with no database.
fn bare(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args).env_remove("LEASEHOLD_DB").env("RUST_BACKTRACE", "1");
    c
}

/// Waits at most [`WAIT`] for `child` to exit, reading its stderr meanwhile.
fn finish(mut child: Child) -> (ExitStatus, String) {
    let stderr = child.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut text = String::new();
            e.read_to_string(&mut text).map(|_| text)
        })
    });
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running after {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = stderr.map_or_else(String::new, |t| t.join().unwrap().unwrap());
    (status, text)
}

/// Runs `cmd`, reads `keep` bytes of its stdout, then closes the pipe.
fn read_then_close(mut cmd: Command, keep: usize) -> (ExitStatus, String) {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut head = vec![0; keep];
    stdout.read_exact(&mut head).unwrap();
    drop(stdout);
    finish(child)
}

/// A pipe whose reader is already closed.
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer
}

/// Runs `cmd` with stdout a pipe whose reader is already gone.
fn into_closed_pipe(mut cmd: Command) -> (ExitStatus, String) {
    let child = cmd.stdout(closed_pipe()).stderr(Stdio::piped()).spawn().unwrap();
    finish(child)
}

fn assert_quiet(what: &str, (status, stderr): (ExitStatus, String)) {
    assert_eq!(status.code(), Some(BROKEN_PIPE), "{what}: {status:?}, stderr: {stderr}");
    assert_eq!(stderr, "", "{what}: stderr must be empty");
}

/// A plan whose JSON is about 2.4 MB: 40 steps with 60 KB payloads.
fn large_plan() -> Value {
    let blob = "x".repeat(60_000);
    let steps: Vec<Value> = (0..40)
        .map(|i| json!({"code": format!("s{i}"), "executor": "dry-run:v1", "payload": {"blob": blob}}))
        .collect();
    json!({"name": "large", "recovery": "resume", "steps": steps})
}

#[test]
fn a_large_read_whose_reader_stops_after_ten_bytes_ends_quietly() {
    let db = Db::new();
    let plan = db.add_plan(&large_plan());
    let full = db.ok(&["plan", "list", "--json"]);
    assert!(
        full.len() > 2_000_000,
        "the output must dwarf any pipe buffer: {}",
        full.len()
    );
    assert_quiet(
        "plan list --json | head -c 10",
        read_then_close(db.cmd(&["plan", "list", "--json"]), 10),
    );
    assert_quiet(
        "plan show --json | head -c 10",
        read_then_close(db.cmd(&["plan", "show", &plan, "--json"]), 10),
    );
}

#[test]
fn every_read_into_a_closed_pipe_ends_quietly() {
    let db = Db::new();
    let plan = db.add_plan(&json!({"name": "p", "recovery": "resume",
        "steps": [{"code": "a", "executor": "dry-run:v1", "payload": {}}]}));
    let mut attempts = Vec::new();
    for _ in 0..2 {
        attempts.push(db.ok(&["enqueue", &plan]).trim().to_owned());
        db.ok(&["worker", "--until-idle", "--poll-secs", "1"]);
    }
    let reads: Vec<Vec<&str>> = vec![
        vec!["plan", "list"],
        vec!["plan", "show", &plan],
        vec!["history", &plan],
        vec!["status", &attempts[0]],
        vec!["compare", &plan],
        vec!["gate", &plan],
        vec!["token", "list"],
    ];
    for read in reads {
        let mut json = read.clone();
        json.push("--json");
        for args in [read, json] {
            assert_quiet(&args.join(" "), into_closed_pipe(db.cmd(&args)));
        }
    }
}

#[test]
fn writes_into_a_closed_pipe_end_quietly_after_their_write() {
    let db = Db::new();
    let file = db.path("p.json");
    std::fs::write(
        &file,
        json!({"name": "p", "recovery": "resume", "steps": [{"code": "a", "executor": "dry-run:v1"}]}).to_string(),
    )
    .unwrap();
    assert_quiet(
        "plan add",
        into_closed_pipe(db.cmd(&["plan", "add", file.to_str().unwrap()])),
    );
    assert_quiet("enqueue", into_closed_pipe(db.cmd(&["enqueue", "p"])));
    assert_quiet(
        "token add",
        into_closed_pipe(db.cmd(&["token", "add", "ci", "--role", "viewer"])),
    );
    // Each write was made before its output was lost.
    let plans: Value = serde_json::from_str(&db.ok(&["plan", "list", "--json"])).unwrap();
    assert_eq!(plans.as_array().unwrap().len(), 1, "{plans}");
    let history: Value = serde_json::from_str(&db.ok(&["history", "p", "--json"])).unwrap();
    assert_eq!(history.as_array().unwrap().len(), 1, "{history}");
    assert!(db.ok(&["token", "list"]).starts_with("ci "));
    assert_quiet("migrate", into_closed_pipe(db.cmd(&["migrate"])));
}

#[test]
fn a_worker_whose_output_is_closed_ends_quietly_and_its_attempts_are_delivered_by_another() {
    let db = Db::new();
    let steps = json!([{"code": "a", "executor": "dry-run:v1"}, {"code": "b", "executor": "dry-run:v1"}]);
    let attempts: Vec<String> = (0..3)
        .map(|i| {
            let plan = db.add_plan(&json!({"name": format!("p{i}"), "recovery": "resume", "steps": steps}));
            db.ok(&["enqueue", &plan]).trim().to_owned()
        })
        .collect();
    let first = [
        "worker",
        "--id",
        "w1",
        "--until-idle",
        "--poll-secs",
        "1",
        "--lease-secs",
        "1",
    ];
    assert_quiet("worker", into_closed_pipe(db.cmd(&first)));
    // Whatever the first worker held, its lease expires and another takes over.
    db.ok(&["worker", "--id", "w2", "--until-idle", "--poll-secs", "1"]);
    for attempt in &attempts {
        let status: Value = serde_json::from_str(&db.ok(&["status", attempt, "--json"])).unwrap();
        assert_eq!(status["attempt"]["status"], "SUCCEEDED", "{status}");
    }
}

#[test]
fn servers_and_the_demo_end_quietly_when_their_output_is_closed() {
    let db = Db::new();
    assert_quiet("demo", into_closed_pipe(db.cmd(&["demo"])));
    assert_quiet(
        "target",
        into_closed_pipe(db.cmd(&["target", "--listen", "127.0.0.1:0", "--seed", "1"])),
    );
    let (status, stderr) = into_closed_pipe(db.cmd(&["serve", "--listen", "127.0.0.1:0", "--workers", "0"]));
    assert_eq!(status.code(), Some(BROKEN_PIPE), "{status:?}, stderr: {stderr}");
    // serve logs on stderr by design; none of it is a panic.
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
}

#[test]
fn help_and_version_into_a_closed_pipe_end_quietly() {
    for args in [&["--help"][..], &["--version"], &["plan", "--help"]] {
        let (status, stderr) = into_closed_pipe(bare(args));
        assert!(
            matches!(status.code(), Some(0) | Some(BROKEN_PIPE)),
            "{args:?}: {status:?}, stderr: {stderr}"
        );
        assert_eq!(stderr, "", "{args:?}");
    }
}

#[test]
fn an_error_whose_stderr_is_closed_keeps_its_exit_status() {
    let db = Db::new();
    let child = db
        .cmd(&["status", "att-missing"])
        .stdout(Stdio::piped())
        .stderr(closed_pipe())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a panic would exit 101");
    assert!(out.stdout.is_empty());
    // token add prints its secret on stdout and its note on stderr: a closed stderr
    // loses the note, not the token.
    let child = db
        .cmd(&["token", "add", "ci", "--role", "viewer"])
        .stdout(Stdio::piped())
        .stderr(closed_pipe())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8(out.stdout).unwrap().starts_with("lh_"));
}

/// One `GET path` on `addr`; answers the status line.
fn get(addr: &str, path: &str) -> String {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn a_server_whose_log_stream_is_closed_keeps_serving_and_stops_cleanly() {
    use std::io::BufRead;
    let db = Db::new();
    let mut child = db
        .cmd(&["serve", "--listen", "127.0.0.1:0", "--workers", "1", "--poll-secs", "1"])
        .stdout(Stdio::piped())
        .stderr(closed_pipe())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let serving = lines
        .find_map(|l| {
            l.unwrap()
                .strip_prefix("serving the console at http://")
                .map(str::to_owned)
        })
        .expect("the serving line");
    let addr = serving.split('/').next().unwrap().to_owned();
    // Every request writes a log line to the closed stderr; each is still answered.
    for _ in 0..3 {
        assert_eq!(get(&addr, "/api/v1/attempts"), "HTTP/1.1 401 Unauthorized");
    }
    assert!(Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success());
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<String>>());
    let (status, _) = finish(child);
    let rest = rest.join().unwrap();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    assert!(rest.iter().any(|l| l.starts_with("stopped: ")), "{rest:?}");
}

#[cfg(target_os = "linux")]
#[test]
fn any_other_output_failure_is_one_line_and_status_1() {
    let db = Db::new();
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let child = db
        .cmd(&["plan", "list"])
        .stdout(full)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, stderr) = finish(child);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "error: cannot write to standard output: No space left on device (os error 28)\n"
    );
}
