//! Damaged and foreign ledger files against the real `leasehold` binary: every read
//! command on damaged rows answers a clean message or shows the damage, never a
//! panic; a ledger from a newer release, a missing file, a directory, a file that is
//! not SQLite and a read-only file are each named and refused (exit 2) or read
//! without being changed.

mod cli_support;

use cli_support::mysql_url_of;
use rusqlite::Connection;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

fn leasehold(url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--db")
        .arg(url)
        .args(args)
        .env_remove("LEASEHOLD_DB")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A ledger with one plan and two delivered attempts of it.
struct Ledger {
    dir: tempfile::TempDir,
    url: String,
    plan: String,
    attempts: Vec<String>,
}

impl Ledger {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let run = |args: &[&str]| {
            let out = leasehold(&url, args);
            assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
            text(&out.stdout)
        };
        run(&["migrate"]);
        let file = dir.path().join("plan.json");
        let plan = json!({"name": "p", "recovery": "resume",
            "steps": [{"code": "a", "executor": "dry-run:v1", "payload": {}},
                      {"code": "b", "executor": "dry-run:v1", "payload": {}}]});
        std::fs::write(&file, plan.to_string()).unwrap();
        let plan = run(&["plan", "add", file.to_str().unwrap()]);
        let plan = plan.split_whitespace().next().unwrap().to_owned();
        let mut attempts = Vec::new();
        for _ in 0..2 {
            attempts.push(run(&["enqueue", &plan]).trim().to_owned());
            run(&["worker", "--until-idle", "--poll-secs", "1"]);
        }
        Ledger {
            dir,
            url,
            plan,
            attempts,
        }
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("ledger.db")
    }

    fn damage(&self, sql: &str) {
        let conn = Connection::open(self.file()).unwrap();
        conn.execute_batch(&format!("PRAGMA ignore_check_constraints = ON; {sql}"))
            .unwrap();
    }

    /// Every read command, as text and as JSON.
    fn reads(&self) -> Vec<Vec<String>> {
        let (plan, a, b) = (&self.plan, &self.attempts[0], &self.attempts[1]);
        let base: Vec<Vec<&str>> = vec![
            vec!["plan", "list"],
            vec!["plan", "show", plan],
            vec!["status", a],
            vec!["history", plan],
            vec!["compare", plan],
            vec!["compare", plan, "--left", a, "--right", b],
            vec!["gate", plan],
        ];
        let mut all = Vec::new();
        for args in base {
            let owned: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            let mut json = owned.clone();
            json.push("--json".into());
            all.push(owned);
            all.push(json);
        }
        all
    }

    /// Runs every read; asserts none panics and every failure is one clean line.
    /// Answers the text of every read, stdout and stderr.
    fn read_everything(&self) -> String {
        let mut seen = String::new();
        for args in self.reads() {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = leasehold(&self.url, &args);
            let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
            let code = out.status.code();
            assert!(
                matches!(code, Some(0 | 1 | 2 | 4)),
                "{args:?} exited {code:?}: {stderr}"
            );
            assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
            if code != Some(0) && code != Some(4) {
                assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
                assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
            }
            seen.push_str(&stdout);
            seen.push_str(&stderr);
        }
        seen
    }
}

#[test]
fn damaged_hashes_and_fingerprints_are_shown_as_damaged() {
    let ledger = Ledger::new();
    ledger.damage("UPDATE receipt SET evidence_sha256 = 'bad'; UPDATE plan SET fingerprint = 'é'");
    let seen = ledger.read_everything();
    assert!(seen.contains("<not a sha-256>"), "{seen}");
    let status = leasehold(&ledger.url, &["status", &ledger.attempts[0]]);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status.stderr));
    assert!(text(&status.stdout).contains("evidence <not a sha-256>"));
    let list = leasehold(&ledger.url, &["plan", "list"]);
    assert!(text(&list.stdout).contains("<not a sha-256>"), "{}", text(&list.stdout));
    // The gate reports the damage as tampering, as before.
    let gate = leasehold(&ledger.url, &["gate", &ledger.plan]);
    assert_eq!(gate.status.code(), Some(4), "{}", text(&gate.stdout));
}

#[test]
fn hostile_stored_text_is_escaped_in_every_read() {
    let ledger = Ledger::new();
    let forged = "x\n[w1] attempt att-0: delivered\u{1b}[2J";
    ledger.damage(&format!(
        "UPDATE plan SET name = '{forged}'; UPDATE attempt SET error = '{forged}'; \
         UPDATE receipt SET step_code = '{forged}', error = '{forged}'; UPDATE command SET last_error = '{forged}'"
    ));
    let seen = ledger.read_everything();
    assert!(!seen.contains('\u{1b}'), "{seen:?}");
    assert!(!seen.lines().any(|l| l.starts_with("[w1]")), "{seen}");
}

#[test]
fn unparseable_rows_are_a_clean_integrity_error() {
    for damage in [
        "UPDATE attempt SET status = 'BOGUS'",
        "UPDATE receipt SET status = 'HALF'",
        "UPDATE command SET status = 'LOST'",
        "UPDATE plan SET steps_json = '{not json'",
        "UPDATE plan SET recovery = 'rewind'",
        "UPDATE attempt SET created_at = 'yesterday'",
    ] {
        let ledger = Ledger::new();
        ledger.damage(damage);
        let seen = ledger.read_everything();
        assert!(
            seen.contains("ledger integrity") || seen.contains("tamper"),
            "{damage}: {seen}"
        );
    }
}

fn set_newest_version(file: &Path, version: i64) {
    let conn = Connection::open(file).unwrap();
    conn.execute(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, 'from-the-future', 0)",
        [version],
    )
    .unwrap();
}

#[test]
fn a_ledger_from_a_newer_release_is_refused_by_every_command_naming_both_versions() {
    let ledger = Ledger::new();
    set_newest_version(&ledger.file(), 99);
    let before = std::fs::read(ledger.file()).unwrap();
    let file = ledger.dir.path().join("plan.json");
    let mut commands = ledger.reads();
    for args in [
        vec!["plan", "add", file.to_str().unwrap()],
        vec!["plan", "retire", &ledger.plan],
        vec!["enqueue", &ledger.plan],
        vec!["worker", "--until-idle"],
        vec!["reconcile", &ledger.attempts[0]],
        vec!["abort", &ledger.attempts[0]],
        vec!["migrate"],
    ] {
        commands.push(args.iter().map(|s| s.to_string()).collect());
    }
    for args in commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = leasehold(&ledger.url, &args);
        let stderr = text(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?} ran on a newer ledger");
        assert!(stderr.contains("schema version 99"), "{args:?}: {stderr}");
        let known = leasehold::ledger::migrate::SQLITE.last().unwrap().version;
        assert!(stderr.contains(&known.to_string()), "{args:?}: {stderr}");
    }
    assert_eq!(
        std::fs::read(ledger.file()).unwrap(),
        before,
        "the newer ledger was changed"
    );
}

#[test]
fn a_missing_file_is_never_created_by_a_read_or_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("nowhere.db").display());
    for args in [
        vec!["status", "att-1"],
        vec!["plan", "list"],
        vec!["history", "p"],
        vec!["gate", "p"],
        vec!["enqueue", "p"],
        vec!["worker", "--until-idle"],
    ] {
        let out = leasehold(&url, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("no ledger at ") && stderr.contains("nowhere.db"),
            "{stderr}"
        );
        assert!(stderr.contains("leasehold migrate"), "{stderr}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "{args:?} created a file"
        );
    }
}

#[test]
fn a_directory_or_a_file_that_is_not_sqlite_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, b"this is not a database, it is a shopping list\n".repeat(100)).unwrap();
    let before = std::fs::read(&junk).unwrap();
    for (path, expected) in [
        (dir.path().to_path_buf(), "is a directory"),
        (junk.clone(), "is not a SQLite database"),
    ] {
        let url = format!("sqlite://{}", path.display());
        for args in [vec!["plan", "list"], vec!["enqueue", "p"], vec!["migrate"]] {
            let out = leasehold(&url, &args);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(
                stderr.contains(&path.display().to_string()) && stderr.contains(expected),
                "{args:?}: {stderr}"
            );
        }
    }
    assert_eq!(std::fs::read(&junk).unwrap(), before);
}

#[test]
fn reads_leave_a_read_only_ledger_file_unchanged() {
    let ledger = Ledger::new();
    let file = ledger.file();
    let mut perms = std::fs::metadata(&file).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&file, perms).unwrap();
    let before = std::fs::read(&file).unwrap();
    let seen = ledger.read_everything();
    assert!(seen.contains(&ledger.plan), "{seen}");
    assert_eq!(std::fs::read(&file).unwrap(), before, "a read changed the ledger file");
}

#[test]
fn a_read_only_ledger_in_a_read_only_directory_can_be_read_by_another_user() {
    let ledger = Ledger::new();
    let dir = ledger.dir.path();
    let file = ledger.file();
    for side in ["ledger.db-wal", "ledger.db-shm", "plan.json"] {
        let _ = std::fs::remove_file(dir.join(side));
    }
    let before = std::fs::read(&file).unwrap();
    let mode = |path: &Path, bits: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(bits)).unwrap();
    };
    mode(&file, 0o444);
    mode(dir, 0o555);
    // As root, file modes bind nobody: read as the unprivileged `nobody` instead.
    let root = Command::new("id").arg("-u").output().unwrap().stdout == b"0\n";
    let read = |args: &[&str]| {
        let mut cmd = if root {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
            c
        } else {
            Command::new(BIN)
        };
        cmd.arg("--db").arg(&ledger.url).args(args).env_remove("LEASEHOLD_DB");
        cmd.output().unwrap()
    };
    for args in [
        vec!["plan", "list"],
        vec!["status", &ledger.attempts[0]],
        vec!["gate", &ledger.plan],
    ] {
        let out = read(&args);
        assert!(
            matches!(out.status.code(), Some(0 | 4)),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let write = read(&["enqueue", &ledger.plan]);
    assert_eq!(write.status.code(), Some(2), "{}", text(&write.stderr));
    assert!(
        text(&write.stderr).contains(&file.display().to_string()),
        "{}",
        text(&write.stderr)
    );
    mode(dir, 0o755);
    assert_eq!(std::fs::read(&file).unwrap(), before, "a read changed the ledger file");
    assert_eq!(files_in(dir), ["ledger.db"], "a read created a file");
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_ledger_unmigrated_or_from_a_newer_release_is_refused_by_every_command() {
    use leasehold::ledger::mysql::scratch::ScratchDatabase;
    use leasehold::ledger::mysql::MysqlUrl;
    use mysql_async::prelude::Queryable;
    let Ok(admin) = std::env::var("LEASEHOLD_TEST_MYSQL_URL") else {
        println!("skipped: LEASEHOLD_TEST_MYSQL_URL is not set (e.g. mysql://root@127.0.0.1:3306/test)");
        return;
    };
    let db = ScratchDatabase::create(&MysqlUrl::parse(&admin).unwrap(), "lh_h11_")
        .await
        .expect("create a test database");
    let url = mysql_url_of(&admin, &db.url().database);
    let cli = |args: Vec<&str>| {
        let url = url.clone();
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            leasehold(&url, &args)
        })
    };
    for args in [vec!["plan", "list"], vec!["enqueue", "p"]] {
        let out = cli(args.clone()).await.unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("holds no leasehold schema: run `leasehold migrate`"));
    }
    let out = cli(vec!["migrate"]).await.unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut conn = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
    conn.query_drop("INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'from-the-future', 0)")
        .await
        .unwrap();
    conn.disconnect().await.unwrap();
    for args in [
        vec!["plan", "list"],
        vec!["status", "att-1"],
        vec!["enqueue", "p"],
        vec!["worker", "--until-idle"],
    ] {
        let out = cli(args.clone()).await.unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("schema version 99, newer than this binary's"),
            "{args:?}: {stderr}"
        );
    }
}
