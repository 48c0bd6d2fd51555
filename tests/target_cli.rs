//! `leasehold target` as a process: it prints where it listens and where its keys
//! are, serves until SIGTERM and exits 0, keeps its keys across a restart, fails
//! requests only for the `--fail-for` window, refuses bad flags with exit 2 naming
//! the flag, and never prints a database password.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

fn leasehold(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command.args(args).env_remove("LEASEHOLD_DB");
    command
}

/// A running `leasehold target` and its first two lines.
struct Running {
    child: Child,
    addr: String,
    banner: String,
    _lines: Receiver<String>,
}

impl Running {
    fn start(db: &str, extra: &[&str]) -> Self {
        let mut args = vec!["--db", db, "target", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let mut child = leasehold(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let (tx, lines) = channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let wait = Duration::from_secs(30);
        let first = lines.recv_timeout(wait).expect("the target printed where it listens");
        let banner = lines
            .recv_timeout(wait)
            .expect("the target printed its store and faults");
        let addr = first
            .strip_prefix("leasehold target listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .to_owned();
        Self {
            child,
            addr,
            banner,
            _lines: lines,
        }
    }

    fn post(&self, key: &str) -> (u16, bool, String) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let response = reqwest::Client::new()
                .post(format!("http://{}/orders", self.addr))
                .header("idempotency-key", key)
                .body("{}")
                .send()
                .await
                .unwrap();
            let replayed = response.headers().get("idempotent-replayed").is_some();
            (response.status().as_u16(), replayed, response.text().await.unwrap())
        })
    }

    /// SIGTERM, then the exit status (bounded wait).
    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("the target did not stop within 15 s of SIGTERM");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn it_serves_until_sigterm_and_its_keys_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("keys.db").display());
    let first = Running::start(&db, &["--seed", "7", "--delay-ms", "5"]);
    assert_eq!(
        first.banner,
        format!("keys in {db}; faults: fail-rate 0, drop-reply-rate 0, delay 5 ms, seed 7")
    );
    let (status, replayed, body) = first.post("ik-cli");
    assert_eq!((status, replayed), (201, false), "{body}");
    assert!(first.terminate().success());

    let second = Running::start(&db, &[]);
    assert!(
        second.banner.contains("seed "),
        "a random seed is printed: {}",
        second.banner
    );
    let again = second.post("ik-cli");
    assert_eq!(again, (201, true, body), "the stored response, after a restart");
    assert!(second.terminate().success());
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["--fail-rate", "1.5"],
            "error: --fail-rate 1.5: must be a rate between 0 and 1",
        ),
        (
            &["--drop-reply-rate", "-0.1"],
            "error: --drop-reply-rate -0.1: must be a rate between 0 and 1",
        ),
        (
            &["--listen", "not-an-address"],
            "error: --listen not-an-address: cannot listen there",
        ),
        (&["--fail-rate", "often"], "--fail-rate"),
        (
            &["--fail-rate", "1", "--fail-for", "10"],
            "error: --fail-for \"10\": not a duration such as 500ms, 30s, 10m or 1h",
        ),
        (&["--fail-for", "2s"], "--fail-rate"),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["--db", "sqlite::memory:", "target"];
        args.extend_from_slice(flags);
        let out = leasehold(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{flags:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
}

#[test]
fn an_unreachable_store_is_named_without_its_password() {
    for (url, shown) in [
        (
            "mysql://app:s3cr%40t-pw@127.0.0.1:1/keys?connect_timeout_ms=2000",
            "error: target store unavailable: mysql at mysql://app:***@127.0.0.1:1/keys",
        ),
        (
            "postgres://app:s3cr%40t-pw@127.0.0.1:1/keys?connect_timeout_ms=2000",
            "error: target store unavailable: postgres at postgres://app:***@127.0.0.1:1/keys",
        ),
    ] {
        let out = leasehold(&["--db", url, "target", "--listen", "127.0.0.1:0"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with(shown), "{stderr}");
        for secret in ["s3cr", "%40t", "t-pw"] {
            assert!(!stderr.contains(secret), "{secret:?} shown in {stderr}");
        }
        assert!(out.stdout.is_empty(), "nothing is printed before the store is open");
    }
}

#[test]
fn ledger_commands_on_an_unreachable_postgres_say_so_without_the_password() {
    let out = leasehold(&[
        "--db",
        "postgres://app:s3cr%40t-pw@127.0.0.1:1/ledger?connect_timeout_ms=2000",
        "status",
        "att-x",
    ])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ledger unavailable: postgres at postgres://app:***@127.0.0.1:1/ledger"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cr") && !stderr.contains("t-pw"), "{stderr}");
}

#[test]
fn the_shipped_http_plan_is_delivered_to_the_target_twice_and_the_gate_passes() {
    let dir = tempfile::tempdir().unwrap();
    let target = Running::start(
        &format!("sqlite://{}", dir.path().join("target.db").display()),
        &["--drop-reply-rate", "0.5", "--fail-rate", "0.3", "--seed", "11"],
    );
    // The plan as shipped, aimed at this target's port instead of 8080.
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/plans/http.toml")).unwrap();
    assert!(
        shipped.contains("http://127.0.0.1:8080/"),
        "the plan targets the default address"
    );
    let plan = dir.path().join("http.toml");
    std::fs::write(&plan, shipped.replace("127.0.0.1:8080", &target.addr)).unwrap();
    let ledger = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let ok = |args: &[&str]| {
        let mut all = vec!["--db", ledger.as_str()];
        all.extend_from_slice(args);
        let out = leasehold(&all).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    ok(&["migrate"]);
    ok(&["plan", "add", plan.to_str().unwrap()]);
    for _ in 0..2 {
        ok(&["enqueue", "push-order"]);
        let report = ok(&["worker", "--until-idle", "--http-allow", &target.addr]);
        assert!(report.contains("delivered 1, failed 0"), "{report}");
    }
    let gate = ok(&["gate", "push-order"]);
    assert!(gate.starts_with("PASS"), "{gate}");
    let effects = effects(&target.addr);
    assert_eq!((effects.keys, effects.effects), (4, 4), "{effects:?}");
    assert!(effects.by_key.values().all(|n| *n == 1), "{effects:?}");
    assert!(target.terminate().success());
}

#[test]
fn fail_for_fails_requests_only_in_its_window_then_the_target_is_healthy() {
    let window = Duration::from_secs(3);
    let target = Running::start(
        "sqlite::memory:",
        &["--fail-rate", "1", "--fail-for", "3s", "--seed", "5"],
    );
    let started = Instant::now();
    assert_eq!(
        target.banner,
        "keys in sqlite::memory: (not durable: every key is forgotten when the target stops); \
         faults: fail-rate 1 for the first 3000 ms, drop-reply-rate 0, delay 0 ms, seed 5"
    );
    // Inside the window every request fails; one key is sent until it is applied.
    let mut failures = 0u64;
    let applied_after = loop {
        let (status, replayed, body) = target.post("ik-flaky");
        if status == 201 {
            assert!(!replayed, "{body}");
            break started.elapsed();
        }
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("--fail-rate"), "{body}");
        failures += 1;
        assert!(started.elapsed() < Duration::from_secs(60), "still failing after 60 s");
        std::thread::park_timeout(Duration::from_millis(100));
    };
    assert!(failures >= 1, "the first request falls in the window");
    // The window counts from the target's start, which is after the banner was
    // printed (and so before it was read here, give or take the pipe).
    assert!(
        applied_after + Duration::from_millis(500) >= window,
        "applied {applied_after:?} after the banner, inside the {window:?} window"
    );
    // Then healthy: a new key is applied at once, the old one replays.
    assert_eq!(target.post("ik-after").0, 201);
    assert_eq!(target.post("ik-flaky").0, 201);
    let effects = effects(&target.addr);
    assert_eq!(effects.faults.failed, failures, "{effects:?}");
    assert_eq!(
        effects.faults.failed_by_key,
        [("ik-flaky".to_owned(), failures)].into_iter().collect(),
        "{effects:?}"
    );
    assert_eq!(
        (effects.keys, effects.effects, effects.replays),
        (2, 2, 1),
        "{effects:?}"
    );
    assert!(target.terminate().success());
}

/// The target's `GET /effects`.
fn effects(addr: &str) -> leasehold::receiver::Effects {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let body = reqwest::get(format!("http://{addr}/effects"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        serde_json::from_slice(&body).unwrap()
    })
}
