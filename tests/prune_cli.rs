//! `leasehold prune` and `leasehold archive verify`, end to end on a SQLite ledger
//! whose history was written on a clock three years back: the prune archives what it
//! deletes, keeps what the gate reads (its verdict is the same after), and the
//! archive verifies; an archive edited in any way is named line by line (exit 4);
//! bad flags are refused naming the flag (exit 2) and write nothing; `serve` prunes
//! as its configuration file's `[retention]` says.

mod cli_support;
mod procs;

use cli_support::Db;
use leasehold::clock::{Clock, ManualClock};
use leasehold::entropy::SeededEntropy;
use leasehold::ledger::sqlite::SqliteLedger;
use leasehold::ledger::Ledger;
use leasehold_engine::{Action, PlanId, PlanSpec, Timestamp};
use serde_json::{json, Value};
use std::sync::Arc;

/// 2023-11-14T22:13:20Z: long before any test runs.
const LONG_AGO: Timestamp = Timestamp::from_millis(1_700_000_000_000);

/// Writes, on a clock at [`LONG_AGO`], a two-step plan's attempts: #1 SUCCEEDED,
/// #2 FAILED at step 2 (step 1 has evidence), #3 and #4 SUCCEEDED. #3 is the gate's
/// baseline and #4 its latest: a prune of everything old deletes #1 and #2.
async fn history(db: &Db) -> PlanId {
    let path = db.path("ledger.db");
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(LONG_AGO));
    let l = SqliteLedger::open(path.to_str().unwrap(), clock, Arc::new(SeededEntropy::new(7))).unwrap();
    let spec: PlanSpec = serde_json::from_value(json!({
        "name": "kept", "recovery": "resume",
        "steps": [{"code": "a", "executor": "dry-run:v1"}, {"code": "b", "executor": "dry-run:v1"}],
    }))
    .unwrap();
    let plan = l.register_plan(spec, &["dry-run:v1"]).await.unwrap().id;
    for fail in [false, true, false, false] {
        l.enqueue(&plan, Action::Execute).await.unwrap();
        let c = l.claim("w", 1, 60_000).await.unwrap().remove(0);
        for ordinal in [1, 2] {
            l.begin_step(&c.lease, ordinal, 60_000).await.unwrap();
            if fail && ordinal == 2 {
                l.fail(&c.lease, Some(2), "no").await.unwrap();
                break;
            }
            let evidence = json!({"step": ordinal, "rows": [1, 2]});
            l.complete_step(&c.lease, ordinal, &evidence, &json!({}), 60_000)
                .await
                .unwrap();
        }
        if !fail {
            l.finish(&c.lease).await.unwrap();
        }
    }
    plan
}

fn setup() -> (Db, String) {
    let db = Db::new();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let plan = rt.block_on(history(&db));
    (db, plan.to_string())
}

fn code(out: &std::process::Output) -> Option<i32> {
    out.status.code()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

impl Db {
    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        serde_json::from_str(&self.ok(&all)).unwrap()
    }

    fn numbers(&self, plan: &str) -> Vec<u64> {
        let history = self.json(&["history", plan]);
        let records = history.as_array().unwrap();
        records
            .iter()
            .map(|r| r["attempt"]["number"].as_u64().unwrap())
            .collect()
    }

    /// `gate PLAN --json`, which must PASS.
    fn passing_gate(&self, plan: &str) -> Value {
        let report = self.json(&["gate", plan]);
        assert_eq!(report["verdict"], "PASS", "{report}");
        report
    }

    /// An archive of the prune of everything old, at `name`.
    fn pruned_into(&self, name: &str) -> String {
        let file = self.path(name).to_str().unwrap().to_owned();
        let out = self.json(&["prune", "--finished-before", "30d", "--archive", &file, "--batch", "1"]);
        assert_eq!(out, json!({"pruned": 2}));
        file
    }

    /// `archive verify FILE`: its exit code and stdout.
    fn verify(&self, file: &str) -> (Option<i32>, String) {
        let out = self.run(&["archive", "verify", file]);
        (code(&out), text(&out.stdout))
    }
}

#[test]
fn prune_archives_then_deletes_keeps_the_gate_and_the_archive_verifies() {
    let (db, plan) = setup();
    let gate_before = db.passing_gate(&plan);
    assert_eq!(db.numbers(&plan), [1, 2, 3, 4]);
    let file = db.pruned_into("old.jsonl");
    assert_eq!(db.numbers(&plan), [3, 4], "the baseline and the latest are kept");
    assert_eq!(db.passing_gate(&plan), gate_before, "the gate reads the same");
    let (exit, out) = db.verify(&file);
    assert_eq!(exit, Some(0), "{out}");
    assert!(out.starts_with("intact: 2 attempts, 4 receipts"), "{out}");
    let report = db.json(&["archive", "verify", &file]);
    assert_eq!(
        report,
        json!({"intact": true, "attempts": 2, "receipts": 4, "problems": []})
    );
    let archive = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<Value> = archive.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "two attempts and the manifest");
    assert_eq!(lines[0]["attempt"]["number"], 1);
    assert_eq!(lines[1]["attempt"]["status"], "FAILED");
    assert_eq!(lines[0]["plan_id"], plan.as_str());
    assert_eq!(lines[2]["manifest"]["lines"], 2);
    assert!(!archive.contains("lease_token"), "no lease token is ever archived");
    assert_eq!(db.json(&["prune", "--finished-before", "30d"]), json!({"pruned": 0}));
}

#[test]
fn a_dry_run_counts_and_writes_nothing() {
    let (db, plan) = setup();
    let out = db.json(&["prune", "--finished-before", "30d", "--dry-run"]);
    assert_eq!(out, json!({"would_prune": 2}));
    assert_eq!(db.numbers(&plan), [1, 2, 3, 4]);
    let failed = db.json(&["prune", "--finished-before", "30d", "--dry-run", "--state", "failed"]);
    assert_eq!(failed, json!({"would_prune": 1}));
    let recent = db.json(&["prune", "--finished-before", "2000d", "--dry-run"]);
    assert_eq!(recent, json!({"would_prune": 0}), "nothing ended five years ago");
    let said = db.ok(&["prune", "--finished-before", "30d", "--dry-run"]);
    assert_eq!(said, "would prune 2 attempts\n");
}

/// An edit of an archive line: its number (from 1) and text to what stays, if anything.
type Edit<'a> = &'a dyn Fn(usize, &str) -> Option<String>;

/// Rewrites line `n` (from 1) of `file` into `to` with `edit`.
fn edited(file: &str, to: &str, edit: impl Fn(usize, &str) -> Option<String>) {
    let text = std::fs::read_to_string(file).unwrap();
    let lines: Vec<String> = text.lines().enumerate().filter_map(|(i, l)| edit(i + 1, l)).collect();
    std::fs::write(to, lines.join("\n") + "\n").unwrap();
}

#[test]
fn every_tampered_line_is_named_and_verify_exits_4() {
    let (db, _) = setup();
    let file = db.pruned_into("old.jsonl");
    let copy = db.path("copy.jsonl").to_str().unwrap().to_owned();
    let cases: [(&str, Edit<'_>, &[&str]); 4] = [
        (
            "evidence edited on both attempt lines",
            &|_, l| Some(l.replace(r#"\"rows\":[1,2]"#, r#"\"rows\":[1,3]"#)),
            &[
                "line 1: receipt 1 (a) of attempt",
                "line 2: receipt 1 (a)",
                "line 3: the lines before it hash to",
            ],
        ),
        (
            "the manifest's hash edited",
            &|n, l| {
                Some(if n == 3 {
                    l.replace("\"sha256\":\"", "\"sha256\":\"0")
                } else {
                    l.to_owned()
                })
            },
            &["line 3: the lines before it hash to"],
        ),
        (
            "the first line deleted",
            &|n, l| (n != 1).then(|| l.to_owned()),
            &[
                "line 1: it says it is line 2",
                "line 2: manifest counts 2 lines but 1 precede it",
            ],
        ),
        (
            "a line that is not JSON",
            &|n, l| {
                Some(if n == 2 {
                    l[..l.len() / 2].to_owned()
                } else {
                    l.to_owned()
                })
            },
            &["line 2: not JSON"],
        ),
    ];
    for (what, edit, named) in cases {
        edited(&file, &copy, edit);
        let (exit, out) = db.verify(&copy);
        assert_eq!(exit, Some(4), "{what}: {out}");
        assert!(out.starts_with("TAMPERED: "), "{what}: {out}");
        for line in named {
            assert!(out.contains(line), "{what}: {line:?} not in {out}");
        }
    }
    edited(&file, &copy, |n, l| (n != 3).then(|| l.to_owned()));
    let (exit, out) = db.verify(&copy);
    assert_eq!(exit, Some(4), "{out}");
    assert!(out.contains("line 3: no manifest line"), "{out}");
    let missing = db.run(&["archive", "verify", db.path("nowhere.jsonl").to_str().unwrap()]);
    assert_eq!(code(&missing), Some(2));
    assert!(text(&missing.stderr).contains("nowhere.jsonl: cannot read it"));
}

#[test]
fn bad_flags_are_refused_naming_the_flag_and_nothing_is_pruned() {
    let (db, plan) = setup();
    let existing = db.path("taken.jsonl");
    std::fs::write(&existing, "keep me\n").unwrap();
    let taken = existing.to_str().unwrap();
    let cases: [(&[&str], &str); 9] = [
        (
            &["prune", "--finished-before", "0s"],
            "--finished-before \"0s\": must be longer than zero",
        ),
        (&["prune", "--finished-before", "soon"], "--finished-before \"soon\""),
        (&["prune", "--finished-before", "-5d"], "--finished-before \"-5d\""),
        (
            &["prune", "--finished-before", "30d", "--state", "RUNNING"],
            "--state RUNNING",
        ),
        (&["prune", "--finished-before", "30d", "--state", "DONE"], "--state"),
        (&["prune", "--finished-before", "30d", "--batch", "0"], "--batch 0"),
        (
            &["prune", "--finished-before", "30d", "--rest-percent", "10001"],
            "--rest-percent 10001",
        ),
        (&["prune", "--finished-before", "30d", "--archive", taken], "--archive"),
        (
            &["prune", "--finished-before", "30d", "--dry-run", "--archive", "x"],
            "--dry-run",
        ),
    ];
    for (args, named) in cases {
        let out = db.run(args);
        assert_eq!(code(&out), Some(2), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(named), "{args:?}: {}", text(&out.stderr));
    }
    assert_eq!(db.numbers(&plan), [1, 2, 3, 4], "nothing was pruned");
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me\n");
    for args in [
        &["worker", "--until-idle", "--prune-finished-before", "0s"][..],
        &["worker", "--until-idle", "--prune-every", "1h"][..],
    ] {
        let out = db.run(args);
        assert_eq!(code(&out), Some(2), "{args:?}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("--prune-"),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let bench = db.run(&["bench", "--attempts", "1", "--prune-history", "10"]);
    assert_eq!(code(&bench), Some(2));
    assert!(text(&bench.stderr).contains("--prune-history: only on a PostgreSQL ledger"));
    assert_eq!(db.numbers(&plan), [1, 2, 3, 4], "nothing was pruned");
}

#[test]
fn a_worker_prunes_periodically_into_an_archive_directory() {
    let (db, plan) = setup();
    let dir = db.path("archives");
    std::fs::create_dir(&dir).unwrap();
    let dir = dir.to_str().unwrap();
    let args = [
        "worker",
        "--until-idle",
        "--prune-finished-before",
        "30d",
        "--prune-archive-dir",
        dir,
    ];
    db.ok(&args);
    assert_eq!(db.numbers(&plan), [3, 4]);
    let files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let (exit, out) = db.verify(files[0].to_str().unwrap());
    assert_eq!(exit, Some(0), "{out}");
}

#[test]
fn serve_prunes_as_its_configuration_file_says() {
    let (db, plan) = setup();
    let dir = db.path("archives");
    std::fs::create_dir(&dir).unwrap();
    let config = db.path("leasehold.toml");
    let body = format!(
        "db = {:?}\n[serve]\nlisten = \"127.0.0.1:0\"\nworkers = 0\n\
         [retention]\nfinished_before = \"30d\"\nstates = [\"FAILED\"]\narchive_dir = {:?}\n",
        db.url,
        dir.to_str().unwrap()
    );
    std::fs::write(&config, body).unwrap();
    let mut serve = std::process::Command::new(procs::BIN);
    serve.args(["--config", config.to_str().unwrap(), "serve"]);
    serve.env_remove("LEASEHOLD_DB").env_remove("LEASEHOLD_CONFIG");
    let (child, out) = procs::spawn_command(serve);
    let serve = procs::Proc(child, out);
    let line = serve
        .1
        .wait_for_stderr("serve", "periodic prune", std::time::Duration::from_secs(60));
    assert!(
        line.contains("pruned=1"),
        "only the FAILED attempt, as states says: {line}"
    );
    assert_eq!(db.numbers(&plan), [1, 3, 4]);
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let (exit, report) = db.verify(files[0].to_str().unwrap());
    assert_eq!(exit, Some(0), "{report}");
}
