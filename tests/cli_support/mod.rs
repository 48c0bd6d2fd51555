//! The `leasehold` binary on a scratch SQLite ledger: what the CLI tests share.
//! Each test file that runs the binary includes it with `mod cli_support;` and adds
//! its own helpers in `impl Db` blocks of its own.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

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
