//! What the real-process tests share (`chaos.rs`, `ordered_chaos.rs`,
//! `delivery_policy.rs`, `mixed_fleet.rs`, `limited_fleet.rs`): a runtime,
//! one run at a time, a fresh migrated ledger on each backend beside its target's
//! store, and `leasehold` child processes whose output is collected as it comes.
// Each test file uses its part of this.
#![allow(dead_code)]

pub mod outcome;

use leasehold::clock::SystemClock;
use leasehold::entropy::OsEntropy;
use leasehold::ledger::mysql::{MysqlLedger, MysqlUrl};
use leasehold::ledger::postgres::{PostgresLedger, PostgresUrl};
use leasehold::ledger::sqlite::SqliteLedger;
use leasehold::ledger::Ledger;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// The runs go one at a time: each uses the machine's two cores alone.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds the machine for one run until dropped.
pub fn alone() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A small multi-threaded runtime for the test's own ledger calls.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A run on one backend: the ledger (migrated), its URL for the processes, and
/// where the target keeps its store.
pub trait Scenario {
    /// Runs against `ledger`, reached by the processes at `ledger_url`, with the
    /// target's store at `target_url`.
    fn run<L: Ledger>(self, ledger: &L, ledger_url: &str, target_url: &str);
}

/// Runs `scenario` on a fresh SQLite file, the target's store in another.
pub fn on_sqlite(runtime: &tokio::runtime::Runtime, scenario: impl Scenario) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db").display().to_string();
    let ledger = runtime.block_on(async {
        let ledger = SqliteLedger::open(&path, Arc::new(SystemClock), Arc::new(OsEntropy)).unwrap();
        ledger.migrate().await.unwrap();
        ledger
    });
    let target = format!("sqlite://{}", dir.path().join("target.db").display());
    scenario.run(&ledger, &format!("sqlite://{path}"), &target);
}

/// Runs `scenario` on a scratch MariaDB / MySQL database named `prefix…` (the target
/// keeps its own tables there too); says it is skipped without
/// `LEASEHOLD_TEST_MYSQL_URL`.
pub fn on_mysql(runtime: &tokio::runtime::Runtime, prefix: &str, scenario: impl Scenario) {
    let Ok(admin) = std::env::var("LEASEHOLD_TEST_MYSQL_URL") else {
        println!("skipped: LEASEHOLD_TEST_MYSQL_URL is not set (e.g. mysql://root@127.0.0.1:3306/test)");
        return;
    };
    let admin = MysqlUrl::parse(&admin).expect("LEASEHOLD_TEST_MYSQL_URL");
    let scratch = runtime
        .block_on(leasehold::ledger::mysql::scratch::ScratchDatabase::create(
            &admin, prefix,
        ))
        .expect("a scratch database");
    let ledger = runtime.block_on(async {
        let ledger = MysqlLedger::open(scratch.url(), Arc::new(OsEntropy));
        ledger.migrate().await.unwrap();
        ledger
    });
    let url = scratch.url().expose();
    scenario.run(&ledger, &url, &url);
    drop(ledger);
}

/// Runs `scenario` on a scratch PostgreSQL database named `prefix…` (the target keeps
/// its own tables there too); says it is skipped without
/// `LEASEHOLD_TEST_POSTGRES_URL`.
pub fn on_postgres(runtime: &tokio::runtime::Runtime, prefix: &str, scenario: impl Scenario) {
    let Ok(admin) = std::env::var("LEASEHOLD_TEST_POSTGRES_URL") else {
        println!("skipped: LEASEHOLD_TEST_POSTGRES_URL is not set (e.g. postgres://postgres@127.0.0.1:5432/test)");
        return;
    };
    let admin = PostgresUrl::parse(&admin).expect("LEASEHOLD_TEST_POSTGRES_URL");
    let scratch = runtime
        .block_on(leasehold::ledger::postgres::scratch::ScratchDatabase::create(
            &admin, prefix,
        ))
        .expect("a scratch database");
    let ledger = runtime.block_on(async {
        let ledger = PostgresLedger::open(scratch.url(), Arc::new(OsEntropy)).unwrap();
        ledger.migrate().await.unwrap();
        ledger
    });
    let url = scratch.url().expose();
    scenario.run(&ledger, &url, &url);
    drop(ledger);
}

/// A child's output as collected so far: its stdout by line, its stderr whole.
#[derive(Clone, Default)]
pub struct Output {
    lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
}

/// Starts `leasehold ARGS` with both pipes drained from the start (a process whose
/// pipe is full blocks in the middle of whatever it was doing).
pub fn spawn(args: &[&str]) -> (Child, Output) {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("LEASEHOLD_DB")
        .env_remove("LEASEHOLD_HTTP_ALLOW");
    spawn_command(command)
}

/// Starts `command` (the binary with its arguments and environment) as [`spawn`]
/// does.
pub fn spawn_command(mut command: Command) -> (Child, Output) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a leasehold process");
    let output = Output::default();
    let out = child.stdout.take().unwrap();
    let sink = Arc::clone(&output.lines);
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    let mut err = child.stderr.take().unwrap();
    let sink = Arc::clone(&output.stderr);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = err.read(&mut buf) {
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (child, output)
}

impl Output {
    /// Its stdout lines so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Its stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Whether a line of its output so far contains `needle`.
    pub fn printed(&self, needle: &str) -> bool {
        self.lines.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// Both streams so far, for a failure message.
    pub fn text(&self) -> String {
        format!("{}\n{}", self.lines().join("\n"), self.stderr())
    }

    /// Waits (bounded) for the first output line containing `needle`; `who` names
    /// the process in the failure.
    pub fn wait_for_line(&self, who: &str, needle: &str, within: Duration) -> String {
        self.wait_for(who, needle, within, |o| o.lines())
    }

    /// Waits (bounded) for the first stderr line (a log line) containing `needle`.
    pub fn wait_for_stderr(&self, who: &str, needle: &str, within: Duration) -> String {
        self.wait_for(who, needle, within, |o| o.stderr().lines().map(str::to_owned).collect())
    }

    fn wait_for(&self, who: &str, needle: &str, within: Duration, lines: impl Fn(&Self) -> Vec<String>) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(line) = lines(self).into_iter().find(|l| l.contains(needle)) {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "{who} printed no line with {needle:?}; stdout and stderr: {}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A `leasehold` child process with its output, killed when dropped.
pub struct Proc(pub Child, pub Output);

impl Proc {
    /// Starts `leasehold ARGS` ([`spawn`]).
    pub fn spawn(args: &[&str]) -> Self {
        let (child, out) = spawn(args);
        Self(child, out)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A named `leasehold` child process that a chaos schedule kills and pauses: its
/// output, and what the schedule did to it. Killed when dropped.
pub struct Killable {
    /// Its name in the schedule (`w3`, `target`).
    pub id: String,
    /// The process.
    pub child: Child,
    /// Its output.
    pub out: Output,
    /// Whether the schedule killed it.
    pub killed: bool,
    /// How often the schedule paused it.
    pub pauses: u32,
    /// Until when it is paused, if it is.
    pub paused_until: Option<Instant>,
}

impl Killable {
    /// Starts `leasehold ARGS` as `id` ([`spawn`]).
    pub fn spawn(id: &str, args: &[&str]) -> Self {
        let (child, out) = spawn(args);
        Self {
            id: id.to_owned(),
            child,
            out,
            killed: false,
            pauses: 0,
            paused_until: None,
        }
    }

    /// Sends `sig`, which must reach it.
    pub fn signal(&self, sig: &str) {
        assert!(self.try_signal(sig), "kill -{sig} {}", self.id);
    }

    /// Sends `sig`; `false` when the process is gone (it exited on its own).
    pub fn try_signal(&self, sig: &str) -> bool {
        Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .stderr(Stdio::null())
            .status()
            .expect("run kill")
            .success()
    }

    /// Whether it has not exited.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its output lines so far.
    pub fn lines(&self) -> Vec<String> {
        self.out.lines()
    }

    /// Waits (bounded) for the first output line containing `needle`.
    pub fn wait_for_line(&self, needle: &str, within: Duration) -> String {
        self.out.wait_for_line(&self.id, needle, within)
    }
}

impl Drop for Killable {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The seed of a run's schedule, and how the run fails: naming the run and the seed
/// that replays it.
pub struct Seeded {
    /// What runs (`chaos (sqlite)`).
    pub what: String,
    /// The seed.
    pub seed: u64,
    var: &'static str,
    replay: &'static str,
}

impl Seeded {
    /// `$var` when set (a replay), a fresh seed otherwise; printed to stderr as
    /// `what: seed N (replay with var=N replay)`.
    pub fn new(var: &'static str, what: String, replay: &'static str) -> Self {
        use leasehold::entropy::Entropy;
        let seed = match std::env::var(var) {
            Ok(s) => s
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{var} must be a whole number")),
            Err(_) => leasehold::entropy::OsEntropy.next_u64(),
        };
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!("{what}: seed {seed} (replay with {var}={seed} {replay})\n"),
        );
        Self {
            what,
            seed,
            var,
            replay,
        }
    }

    /// Fails the test with `problems`, naming the run and the seed that replays it.
    pub fn fail(&self, problems: &[String]) -> ! {
        panic!(
            "{} seed {} — replay with {}={} {}:\n{}",
            self.what,
            self.seed,
            self.var,
            self.seed,
            self.replay,
            problems.join("\n")
        )
    }

    /// Fails the test if there are `problems`.
    pub fn check_all(&self, problems: Vec<String>) {
        if !problems.is_empty() {
            self.fail(&problems);
        }
    }

    /// Fails the test with `problem` unless `ok`.
    pub fn check(&self, ok: bool, problem: impl FnOnce() -> String) {
        if !ok {
            self.fail(&[problem()]);
        }
    }
}

/// A seeded source of a chaos schedule's choices.
pub struct Draws(pub leasehold::entropy::SeededEntropy);

impl Draws {
    /// A draw in `0..n`.
    pub fn below(&self, n: u64) -> u64 {
        use leasehold::entropy::Entropy;
        self.0.next_u64() % n.max(1)
    }

    /// A duration of `lo..=hi` ms.
    pub fn ms(&self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// Runs `leasehold ARGS` to its end; answers its stdout (it must succeed).
pub fn run_cli(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().expect("run leasehold");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The reference receiver's `GET /effects` at `addr`.
pub fn effects(runtime: &tokio::runtime::Runtime, addr: &str) -> leasehold::receiver::Effects {
    runtime.block_on(async {
        let body = reqwest::get(format!("http://{addr}/effects"))
            .await
            .expect("GET /effects")
            .bytes()
            .await
            .unwrap();
        serde_json::from_slice(&body).expect("effects JSON")
    })
}
