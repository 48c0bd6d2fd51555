//! `--config FILE` and `leasehold config check|show` as an operator runs them: a
//! misspelt key caught with the nearest name; precedence, a flag over the
//! environment over the file over the default; a deployment described by the file
//! alone; the errors for a file that cannot be read, a retention that is not a span
//! of time and a secret written inline; and secrets never printed.

mod procs;

use procs::{Proc, BIN};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// How long a process may take to print what a test waits for.
const WITHIN: Duration = Duration::from_secs(60);

/// Whether an environment variable may set a setting (every `LEASEHOLD_*` but the
/// tests' own): removed from every run, so that only what a test sets counts.
fn is_setting(var: &str) -> bool {
    var.starts_with("LEASEHOLD_") && !var.starts_with("LEASEHOLD_TEST_")
}

fn leasehold(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args).env("RUST_BACKTRACE", "1");
    for (var, _) in std::env::vars_os() {
        if var.to_str().is_some_and(is_setting) {
            c.env_remove(var);
        }
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    leasehold(args, env).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A file `name` holding `body` in a fresh directory.
fn file(dir: &tempfile::TempDir, name: &str, body: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, body).unwrap();
    path
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `config check FILE`: the exit code and stderr.
fn check(path: &Path) -> (Option<i32>, String, String) {
    let out = run(&["config", "check", arg(path)], &[]);
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn a_misspelt_key_is_named_with_the_nearest_known_one_and_every_wrong_key_is_listed() {
    let dir = tempfile::tempdir().unwrap();
    let bad = file(
        &dir,
        "bad.toml",
        "[serve]\nlease_sec = 30\nlog_format = \"xml\"\n[sever]\nlisten = \"127.0.0.1:1\"\n\
         [worker]\nbatch = \"5\"\nlease_secs = 0\nqueues = [\"ok\", \"\"]\n",
    );
    let (code, stdout, stderr) = check(&bad);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    for expected in [
        "error: serve.lease_sec: unknown key; did you mean serve.lease_secs?",
        "error: serve.log_format: invalid value 'xml'",
        "error: sever: unknown section; did you mean serve?",
        "error: worker.batch: expected an integer, found string",
        "error: worker.lease_secs: 0 is out of range 1..=86400",
        "error: worker.queues: must not be empty",
    ] {
        assert!(stderr.contains(expected), "no {expected:?} in:\n{stderr}");
    }
    assert!(stderr.contains("6 errors"), "{stderr}");
    // A command run with the file does not start, and names the key.
    let worker = run(&["--config", arg(&bad), "worker", "--until-idle"], &[]);
    assert_eq!(worker.status.code(), Some(2));
    assert!(text(&worker.stderr).contains("serve.lease_sec: unknown key; did you mean serve.lease_secs?"));
    // The same settings spelt right pass.
    let good = file(
        &dir,
        "good.toml",
        "[serve]\nlease_secs = 30\nlog_format = \"json\"\n[worker]\nbatch = 5\nlease_secs = 1\nqueues = [\"ok\"]\n",
    );
    let (code, stdout, stderr) = check(&good);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.starts_with("ok: ") && stdout.contains("5 settings"), "{stdout}");
    // LEASEHOLD_CONFIG names the file when `check` is given none.
    let by_env = run(&["config", "check"], &[("LEASEHOLD_CONFIG", arg(&bad))]);
    assert_eq!(by_env.status.code(), Some(2));
    let none = run(&["config", "check"], &[]);
    assert_eq!(none.status.code(), Some(2));
    assert!(text(&none.stderr).contains("no file given"), "{}", text(&none.stderr));
}

/// `config show --json` run with `args` and `env`.
fn show(args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let out = run(args, env);
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

#[test]
fn a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let config = file(
        &dir,
        "leasehold.toml",
        "db = \"sqlite://file.db\"\n[serve]\nlease_secs = 11\npoll_secs = 12\n\
         [http]\nallow = [\"file.example\"]\n[worker]\nbatch = 7\n",
    );
    let path = arg(&config);
    let env = [
        ("LEASEHOLD_HTTP_ALLOW", "env.example"),
        ("LEASEHOLD_DB", "sqlite://env.db"),
        ("LEASEHOLD_SERVE_GRACE_SECS", "21"),
    ];
    let json = show(
        &[
            "--config",
            path,
            "--json",
            "config",
            "show",
            "--",
            "serve",
            "--lease-secs",
            "33",
        ],
        &env,
    );
    let setting = |section: &str, key: &str| {
        let s = if section.is_empty() {
            &json[key]
        } else {
            &json[section][key]
        };
        (s["value"].clone(), s["source"].as_str().unwrap_or_default().to_owned())
    };
    assert_eq!(setting("serve", "lease_secs"), (33.into(), "flag --lease-secs".into()));
    assert_eq!(
        setting("http", "allow"),
        (serde_json::json!(["env.example"]), "env LEASEHOLD_HTTP_ALLOW".into())
    );
    assert_eq!(setting("", "db"), ("sqlite://env.db".into(), "env LEASEHOLD_DB".into()));
    assert_eq!(setting("serve", "poll_secs"), (12.into(), format!("file {path}")));
    assert_eq!(
        setting("serve", "grace_secs"),
        (21.into(), "env LEASEHOLD_SERVE_GRACE_SECS".into()),
        "every key has its variable, LEASEHOLD_ and the key"
    );
    assert_eq!(setting("serve", "batch"), (5.into(), "default".into()));
    assert!(json.get("worker").is_none(), "only serve's settings: {json}");
    // One key through each level: the flag, then the variable, then the file, then
    // the default.
    let allow = |args: &[&str], env: &[(&str, &str)]| {
        let mut line = vec!["--json", "config", "show", "--", "serve"];
        line.extend_from_slice(args);
        show(&line, env)["http"]["allow"]["value"].clone()
    };
    let with_file = [("LEASEHOLD_CONFIG", path)];
    let all = [with_file[0], env[0]];
    assert_eq!(
        allow(&["--http-allow", "flag.example"], &all),
        serde_json::json!(["flag.example"])
    );
    assert_eq!(allow(&[], &all), serde_json::json!(["env.example"]));
    assert_eq!(allow(&[], &with_file), serde_json::json!(["file.example"]));
    assert_eq!(allow(&[], &[]), serde_json::json!([]));
    // Without a command line, serve's and worker's settings; --db given as a flag.
    let both = show(
        &["--config", path, "--db", "sqlite://flag.db", "--json", "config", "show"],
        &env,
    );
    assert_eq!(both["db"]["value"], "sqlite://flag.db");
    assert_eq!(both["db"]["source"], "flag --db");
    assert_eq!(both["worker"]["batch"]["value"], 7);
    let worker_batch =
        |env: &[(&str, &str)]| show(&["--json", "config", "show", "--", "worker"], env)["worker"]["batch"].clone();
    let over_file = worker_batch(&[with_file[0], ("LEASEHOLD_WORKER_BATCH", "9")]);
    assert_eq!(over_file["value"], 9, "the variable beats the file: {over_file}");
    assert_eq!(over_file["source"], "env LEASEHOLD_WORKER_BATCH");
    assert_eq!(both["worker"]["lease_secs"]["source"], "default");
    assert_eq!(both["serve"]["lease_secs"]["value"], 11);
    // As TOML, each value with its source, and itself a file `config check` reads.
    let toml = run(&["--config", path, "config", "show", "--", "worker"], &[]);
    let shown = text(&toml.stdout);
    assert!(shown.contains(&format!("batch = 7  # file {path}")), "{shown}");
    assert!(shown.contains("lease_secs = 60  # default"), "{shown}");
    assert!(shown.contains("# id: unset"), "{shown}");
    let again = file(&dir, "shown.toml", &shown);
    let (code, _, stderr) = check(&again);
    assert_eq!(code, Some(0), "{stderr}\n{shown}");
}

/// Starts `command` ([`procs::spawn_command`]).
fn start(command: Command) -> Proc {
    let (child, output) = procs::spawn_command(command);
    Proc(child, output)
}

/// SIGTERM, then the exit status.
fn terminate(mut proc: Proc) -> std::process::ExitStatus {
    let pid = proc.0.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    proc.0.wait().unwrap()
}

#[test]
fn serve_and_a_worker_started_with_only_the_file_deliver_an_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let config = file(
        &dir,
        "leasehold.toml",
        "db = { env = \"DEPLOY_DB_URL\" }\n\
         [serve]\nlisten = \"127.0.0.1:0\"\nworkers = 0\n\
         [worker]\nid = \"file-worker\"\nlease_secs = 30\npoll_secs = 1\nbatch = 2\ngrace_secs = 0\n",
    );
    let env = [("DEPLOY_DB_URL", db.as_str())];
    let with_file = |args: &[&str]| {
        let mut line = vec!["--config", arg(&config)];
        line.extend_from_slice(args);
        leasehold(&line, &env)
    };
    let serve = start(with_file(&["serve"]));
    // The ledger is the file's, created by serve; serve has the file's 0 workers.
    let started = serve.1.wait_for_line("serve", "serving the console", WITHIN);
    assert!(started.contains("0 in-process workers"), "{started}");
    let plan = file(
        &dir,
        "plan.toml",
        "name = \"deployed\"\nrecovery = \"resume\"\n[[steps]]\ncode = \"a\"\nexecutor = \"dry-run:v1\"\npayload = {}\n",
    );
    let added = with_file(&["plan", "add", arg(&plan)]).output().unwrap();
    assert!(added.status.success(), "{}", text(&added.stderr));
    let enqueued = with_file(&["enqueue", "deployed"]).output().unwrap();
    assert!(enqueued.status.success(), "{}", text(&enqueued.stderr));
    let attempt = text(&enqueued.stdout).trim().to_owned();
    let worker = start(with_file(&["worker"]));
    let delivered = format!("[file-worker] attempt {attempt}: delivered");
    worker.1.wait_for_line("worker", &delivered, WITHIN);
    let output = worker.1.clone();
    let status = terminate(worker);
    assert!(status.success(), "{status:?}: {}", output.text());
    let status = with_file(&["--json", "status", &attempt]).output().unwrap();
    let record: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(record["attempt"]["status"], "SUCCEEDED", "{record}");
    let status = terminate(serve);
    assert!(status.success(), "{status:?}");
}

#[test]
fn an_unreadable_file_is_an_error_naming_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    let cases = [
        (vec!["config", "check", arg(&missing)], arg(&missing)),
        (vec!["--config", arg(&missing), "worker", "--until-idle"], arg(&missing)),
        (vec!["--config", arg(dir.path()), "config", "show"], arg(dir.path())),
    ];
    for (args, path) in cases {
        let out = run(&args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!("config file {path}: cannot read it")),
            "{args:?}: {stderr}"
        );
    }
    // A secret's file is read when a worker starts: missing, it is named; read, the
    // executor checks its value as if the environment had set it.
    let db = format!("sqlite://{}", dir.path().join("ledger.db").display());
    assert!(run(&["--db", &db, "migrate"], &[]).status.success());
    let secret = dir.path().join("hook.secret");
    let config = file(
        &dir,
        "secret-file.toml",
        &format!(
            "db = \"{db}\"\n[http]\nallow = [\"127.0.0.1:9\"]\n[http.secrets]\nLEASEHOLD_SECRET_HOOK = \"127.0.0.1:9\"\n\
             [http.secret_sources]\nLEASEHOLD_SECRET_HOOK = {{ file = \"{}\" }}\n",
            secret.display()
        ),
    );
    let worker = || run(&["--config", arg(&config), "worker", "--until-idle"], &[]);
    let out = worker();
    assert_eq!(out.status.code(), Some(2));
    let expected = format!("http.secret_sources.LEASEHOLD_SECRET_HOOK: file {}: ", secret.display());
    assert!(text(&out.stderr).contains(&expected), "{}", text(&out.stderr));
    std::fs::write(&secret, "short\n").unwrap();
    let out = worker();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("LEASEHOLD_SECRET_HOOK is shorter than 8 bytes"),
        "{}",
        text(&out.stderr)
    );
    std::fs::write(&secret, "a-signing-secret-long-enough\n").unwrap();
    let out = worker();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let broken = file(&dir, "broken.toml", "[serve\nlease_secs = 1\n");
    let (code, _, stderr) = check(&broken);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains(&format!("config file {}: line 1", broken.display())),
        "{stderr}"
    );
}

#[test]
fn a_retention_that_is_not_a_span_of_time_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("finished_before = \"-30d\"", "retention.finished_before"),
        (
            "finished_before = \"0s\"",
            "retention.finished_before: must be longer than zero",
        ),
        (
            "every = -5",
            "retention.every: expected a duration such as \"30d\", found integer",
        ),
        ("every = \"soon\"", "retention.every"),
        ("batch = 0", "retention.batch: 0 is out of range"),
        (
            "states = [\"QUEUED\"]",
            "retention.states: \"QUEUED\" is not the state of a finished attempt",
        ),
        ("keep = \"30d\"", "retention.keep: unknown key"),
    ];
    for (line, expected) in cases {
        let path = file(&dir, "retention.toml", &format!("[retention]\n{line}\n"));
        let (code, _, stderr) = check(&path);
        assert_eq!(code, Some(2), "{line}: {stderr}");
        assert!(stderr.contains(&format!("error: {expected}")), "{line}: {stderr}");
    }
    let good = file(
        &dir,
        "good.toml",
        "[retention]\nfinished_before = \"30d\"\nstates = [\"SUCCEEDED\", \"ABORTED\"]\nevery = \"1h\"\n\
         archive_dir = \"/var/lib/leasehold/archive\"\nbatch = 500\n",
    );
    let (code, _, stderr) = check(&good);
    assert_eq!(code, Some(0), "{stderr}");
    let json = show(&["--config", arg(&good), "--json", "config", "show"], &[]);
    assert_eq!(json["retention"]["finished_before"]["value"], "30d");
    assert_eq!(json["retention"]["batch"]["value"], 500);
}

const DB_PASSWORD: &str = "db-pass-4f7c1e9a";
const SIGNING_SECRET: &str = "whsec_c2lnbmluZy1rZXktOTkxMg==";

#[test]
fn a_secret_written_inline_is_named_a_password_warned_about_and_neither_is_printed() {
    let dir = tempfile::tempdir().unwrap();
    let inline_db = file(
        &dir,
        "db.toml",
        &format!("db = \"postgres://leasehold:{DB_PASSWORD}@db.internal:5432/leasehold\"\n"),
    );
    let (code, stdout, stderr) = check(&inline_db);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("warning: db: the URL holds a password"), "{stderr}");
    assert!(stderr.contains("db = { env = \"LEASEHOLD_DB\" }"), "{stderr}");
    assert!(!stdout.contains(DB_PASSWORD) && !stderr.contains(DB_PASSWORD));
    for body in [
        format!("[http.secret_sources]\nLEASEHOLD_SECRET_HOOK = \"{SIGNING_SECRET}\"\n"),
        format!("[http.secrets]\nLEASEHOLD_SECRET_HOOK = \"{SIGNING_SECRET}\"\n"),
        format!("[http.secret_sources]\nLEASEHOLD_SECRET_HOOK = {{ value = \"{SIGNING_SECRET}\" }}\n"),
    ] {
        let path = file(&dir, "secret.toml", &body);
        let (code, stdout, stderr) = check(&path);
        assert_eq!(code, Some(2), "{body}: {stderr}");
        assert!(stderr.contains("error: http.secret"), "{body}: {stderr}");
        assert!(stderr.contains("LEASEHOLD_SECRET_HOOK"), "{body}: {stderr}");
        assert!(
            !stdout.contains(SIGNING_SECRET) && !stderr.contains(SIGNING_SECRET),
            "{stderr}"
        );
    }
    let inline = file(
        &dir,
        "secret.toml",
        &format!("[http.secret_sources]\nLEASEHOLD_SECRET_HOOK = \"{SIGNING_SECRET}\"\n"),
    );
    let (_, _, stderr) = check(&inline);
    assert!(
        stderr.contains(
            "error: http.secret_sources.LEASEHOLD_SECRET_HOOK: given inline; a secret is given by reference only"
        ),
        "{stderr}"
    );
}

/// Runs `args`, asserts success and that no text of `secrets` is in its output;
/// answers stdout.
fn shown_without(args: &[&str], env: &[(&str, &str)], secrets: &[&str]) -> String {
    let out = run(args, env);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{args:?}: {stderr}");
    for secret in secrets {
        assert!(!stdout.contains(secret), "{args:?} printed a secret:\n{stdout}");
        assert!(!stderr.contains(secret), "{args:?} printed a secret:\n{stderr}");
    }
    stdout
}

#[test]
fn config_show_never_prints_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = file(&dir, "hook.secret", &format!("{SIGNING_SECRET}\n"));
    let url = |password: &str| format!("postgres://leasehold:{password}@db.internal:5432/leasehold");
    let env_password = "env-pass-8d2b6a31";
    let referenced_password = "ref-pass-5e0f3c77";
    let sources = format!(
        "[http.secrets]\nLEASEHOLD_SECRET_HOOK = \"hooks.example.com\"\nLEASEHOLD_SECRET_CRM = [\"crm.example.com:8443\"]\n\
         [http.secret_sources]\nLEASEHOLD_SECRET_HOOK = {{ env = \"HOOK_SIGNING_KEY\" }}\n\
         LEASEHOLD_SECRET_CRM = {{ file = \"{}\" }}\n",
        secret_file.display()
    );
    let in_file = file(
        &dir,
        "in-file.toml",
        &format!("db = \"{}\"\n{sources}", url(DB_PASSWORD)),
    );
    let by_ref = file(&dir, "by-ref.toml", &format!("db = {{ env = \"DB_URL\" }}\n{sources}"));
    let db_url = url(referenced_password);
    let env_url = url(env_password);
    let secrets = [
        DB_PASSWORD,
        env_password,
        referenced_password,
        SIGNING_SECRET,
        "c2lnbmluZy1rZXktOTkxMg",
    ];
    let hook = ("HOOK_SIGNING_KEY", SIGNING_SECRET);
    for json in [false, true] {
        let mut line = vec!["config", "show"];
        if json {
            line.insert(0, "--json");
        }
        let in_file_line = [vec!["--config", arg(&in_file)], line.clone()].concat();
        let by_ref_line = [vec!["--config", arg(&by_ref)], line.clone()].concat();
        // The password in the file's URL, in LEASEHOLD_DB's, in the variable the file
        // names; the signing secret in the variable the file names.
        let shown = shown_without(&in_file_line, &[hook], &secrets);
        assert!(
            shown.contains("postgres://leasehold:***@db.internal:5432/leasehold"),
            "{shown}"
        );
        assert!(
            shown.contains("LEASEHOLD_SECRET_HOOK") && shown.contains("HOOK_SIGNING_KEY"),
            "{shown}"
        );
        shown_without(&in_file_line, &[hook, ("LEASEHOLD_DB", &env_url)], &secrets);
        shown_without(&by_ref_line, &[hook, ("DB_URL", &db_url)], &secrets);
        shown_without(
            &by_ref_line,
            &[("DB_URL", &db_url), ("LEASEHOLD_SECRET_HOOK", SIGNING_SECRET)],
            &secrets,
        );
        let flag_url = url(DB_PASSWORD);
        shown_without(&[vec!["--db", &flag_url], line.clone()].concat(), &[], &secrets);
    }
}

#[test]
fn the_example_deployment_file_is_valid_and_drains_before_systemd_stops_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = root.join("deploy/leasehold.toml");
    let (code, stdout, stderr) = check(&example);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.is_empty(), "the example warns: {stderr}");
    assert!(stdout.starts_with("ok: "), "{stdout}");
    // The database URL is read from the environment, as the units provide it.
    let text = std::fs::read_to_string(&example).unwrap();
    assert!(text.contains("db = { env = \"LEASEHOLD_DB\" }"), "{text}");
    let json = show(
        &["--config", arg(&example), "--json", "config", "show"],
        &[("LEASEHOLD_DB", "sqlite://leasehold.db")],
    );
    for unit in [
        "leasehold-serve.service",
        "leasehold-worker.service",
        "leasehold-worker@.service",
    ] {
        let unit_text = std::fs::read_to_string(root.join("deploy/systemd").join(unit)).unwrap();
        assert!(
            unit_text.contains("--config /etc/leasehold/leasehold.toml"),
            "{unit} does not read the file"
        );
        let stop: u64 = unit_text
            .lines()
            .find_map(|l| l.strip_prefix("TimeoutStopSec="))
            .and_then(|v| v.strip_suffix('s'))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{unit}: TimeoutStopSec=Ns"));
        let section = if unit.contains("serve") { "serve" } else { "worker" };
        let grace = json[section]["grace_secs"]["value"].as_u64().unwrap();
        assert!(
            grace < stop,
            "{unit}: {section}.grace_secs {grace} but TimeoutStopSec={stop}s"
        );
    }
}
