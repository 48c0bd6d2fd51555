//! `leasehold limits` on a SQLite ledger file: `set` writes a target's limits and
//! replaces them, `list --json` shows them with their load, a bad value is refused
//! with exit 2 naming the flag and nothing written, `clear` says whether there was
//! anything to clear, and `apply` checks a whole file before it writes any target.

mod cli_support;

use cli_support::Db;
use serde_json::{json, Value};

const CRM: &str = "http://crm.example:80";

impl Db {
    /// Runs a command that must fail with exit 2; answers its error line.
    fn refused(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(out.status.code(), Some(2), "leasehold {args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{out:?}");
        String::from_utf8(out.stderr).unwrap()
    }

    /// `limits list --json`'s `limits`.
    fn limits(&self) -> Vec<Value> {
        let listed: Value = serde_json::from_str(&self.ok(&["limits", "list", "--json"])).unwrap();
        assert!(listed["now"].is_i64(), "{listed}");
        listed["limits"].as_array().unwrap().clone()
    }

    fn file(&self, name: &str, text: &str) -> String {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

#[test]
fn set_writes_a_target_s_limits_and_list_shows_them() {
    let db = Db::new();
    assert_eq!(db.ok(&["limits", "list"]), "no target has limits\n");
    let out = db.ok(&[
        "limits",
        "set",
        CRM,
        "--max-in-flight",
        "2",
        "--rate",
        "50/s",
        "--breaker-failures",
        "5",
        "--breaker-cooldown",
        "30s",
    ]);
    assert_eq!(
        out,
        "set the limits of http://crm.example:80: max in flight 2, rate 50/s, breaker 5 failures, 30 s\n"
    );
    let limits = db.limits();
    assert_eq!(limits.len(), 1, "{limits:?}");
    let row = &limits[0];
    assert_eq!(row["target"], CRM);
    assert_eq!(row["max_in_flight"], 2);
    assert_eq!(row["rate"], json!({"count": 50, "per_ms": 1000}));
    assert_eq!(row["breaker"], json!({"failures": 5, "cooldown_ms": 30000}));
    assert_eq!(row["in_flight"], 0);
    assert_eq!(row["breaker_state"], "closed");
    let table = db.ok(&["limits", "list"]);
    let mut lines = table.lines();
    let head = lines.next().unwrap();
    for column in ["TARGET", "MAX IN FLIGHT", "IN FLIGHT", "RATE", "BREAKER", "STATE"] {
        assert!(head.contains(column), "{table}");
    }
    let line = lines.next().unwrap();
    assert!(
        line.starts_with(CRM) && line.contains("50/s") && line.contains("closed"),
        "{table}"
    );
}

#[test]
fn setting_again_replaces_the_limits_and_removes_those_not_given() {
    let db = Db::new();
    db.ok(&["limits", "set", CRM, "--max-in-flight", "2", "--breaker-failures", "3"]);
    db.ok(&["limits", "set", CRM, "--rate", "10/m"]);
    let limits = db.limits();
    assert_eq!(limits.len(), 1);
    assert_eq!(limits[0]["rate"], json!({"count": 10, "per_ms": 60000}));
    assert!(limits[0].get("max_in_flight").is_none(), "{}", limits[0]);
    assert!(limits[0].get("breaker").is_none(), "{}", limits[0]);
}

#[test]
fn a_limit_of_zero_is_refused_naming_the_flag_and_nothing_is_written() {
    let db = Db::new();
    let e = db.refused(&["limits", "set", CRM, "--max-in-flight", "0"]);
    assert_eq!(e, "error: --max-in-flight: must be at least 1, not 0\n");
    let e = db.refused(&["limits", "set", CRM, "--max-in-flight", "-1"]);
    assert_eq!(e, "error: --max-in-flight: must be at least 1, not -1\n");
    let e = db.refused(&["limits", "set", CRM, "--max-in-flight", "2", "--rate", "fast"]);
    assert!(e.starts_with("error: --rate: "), "{e}");
    let e = db.refused(&[
        "limits",
        "set",
        CRM,
        "--breaker-failures",
        "2",
        "--breaker-cooldown",
        "soon",
    ]);
    assert!(e.starts_with("error: --breaker-cooldown: "), "{e}");
    let e = db.refused(&["limits", "set", CRM]);
    assert!(e.starts_with("error: give at least one of --max-in-flight"), "{e}");
    assert!(db.limits().is_empty());
}

#[test]
fn clear_says_whether_the_target_had_limits() {
    let db = Db::new();
    db.ok(&["limits", "set", CRM, "--max-in-flight", "1"]);
    assert_eq!(
        db.ok(&["limits", "clear", CRM]),
        "cleared the limits of http://crm.example:80\n"
    );
    assert!(db.limits().is_empty());
    assert_eq!(
        db.ok(&["limits", "clear", CRM]),
        "http://crm.example:80 had no limits\n"
    );
    let answer: Value = serde_json::from_str(&db.ok(&["limits", "clear", CRM, "--json"])).unwrap();
    assert_eq!(answer, json!({"target": CRM, "cleared": false}));
}

#[test]
fn apply_sets_every_target_of_a_file_or_none() {
    let db = Db::new();
    let good = db.file(
        "limits.toml",
        "[targets.\"http://crm.example:80\"]\nmax_in_flight = 2\nrate = \"50/s\"\n\
         breaker_failures = 5\nbreaker_cooldown = \"30s\"\n\n[targets.mailer]\nrate = \"100/h\"\n",
    );
    db.ok(&["limits", "apply", &good]);
    let limits = db.limits();
    let targets: Vec<&str> = limits.iter().map(|l| l["target"].as_str().unwrap()).collect();
    assert_eq!(targets, [CRM, "mailer"]);
    assert_eq!(limits[0]["breaker"], json!({"failures": 5, "cooldown_ms": 30000}));
    assert_eq!(limits[1]["rate"], json!({"count": 100, "per_ms": 3600000}));

    // One bad entry: the error names its target and field, and no entry is written.
    db.ok(&["limits", "clear", CRM]);
    db.ok(&["limits", "clear", "mailer"]);
    let bad = db.file(
        "bad.toml",
        "[targets.first]\nmax_in_flight = 3\n[targets.second]\nmax_in_flight = 0\n",
    );
    let e = db.refused(&["limits", "apply", &bad]);
    assert!(
        e.ends_with("target \"second\": max_in_flight: must be at least 1, not 0\n"),
        "{e}"
    );
    assert!(db.limits().is_empty());
}
