//! The `leasehold` binary on a scratch SQLite ledger: what the CLI tests share.
//! Each test file that runs the binary includes it with `mod cli_support;` and adds
//! its own helpers in `impl Db` blocks of its own.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// A migrated SQLite ledger in a temporary directory of its own.
pub struct Db {
    pub dir: tempfile::TempDir,
    pub url: String,
}

impl Db {
    /// A fresh ledger, migrated.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let db = Db { dir, url };
        db.ok(&["migrate"]);
        db
    }

    /// A file in the ledger's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `leasehold --db … args`, with backtraces on: a panic would show one.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.arg("--db")
            .arg(&self.url)
            .args(args)
            .env_remove("LEASEHOLD_DB")
            .env("RUST_BACKTRACE", "1");
        c
    }

    /// Runs `args` to the end.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// Runs `args`, which must succeed; answers its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "leasehold {args:?} failed ({:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Registers `plan` (JSON) from the file `file` in the ledger's directory;
    /// answers the plan's id.
    pub fn add_plan_file(&self, file: &str, plan: &serde_json::Value) -> String {
        let path = self.path(file);
        std::fs::write(&path, plan.to_string()).unwrap();
        let out = self.ok(&["plan", "add", path.to_str().unwrap()]);
        out.split_whitespace().next().unwrap().to_owned()
    }
}

/// The URL of database `name` on the server of the MySQL URL `admin` (the same
/// user, password and options).
pub fn mysql_url_of(admin: &str, name: &str) -> String {
    let (base, query) = admin.split_once('?').map_or((admin, None), |(b, q)| (b, Some(q)));
    let (server, _) = base.rsplit_once('/').expect("a mysql URL with a database");
    match query {
        Some(q) => format!("{server}/{name}?{q}"),
        None => format!("{server}/{name}"),
    }
}

/// A long-running `leasehold` child (`serve`), its stdout read line by line; killed
/// if the test ends early.
pub struct Server {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `cmd` with its stdout and stderr piped.
    pub fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start leasehold");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self { child, lines }
    }

    /// The next stdout line (within 30 s).
    pub fn line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a line within 30 s")
    }

    /// Stdout lines until one contains `needle` (within 30 s).
    pub fn until(&self, needle: &str) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no line with {needle:?}; saw {seen:?}"));
            let done = line.contains(needle);
            seen.push(line);
            if done {
                return seen;
            }
        }
    }

    /// SIGTERM, then the exit status and all of stderr.
    pub fn terminate(mut self) -> (ExitStatus, String) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let mut stderr = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        let status = self.child.wait().unwrap();
        (status, stderr)
    }
}
