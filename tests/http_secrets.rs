//! `leasehold worker` with `http:v1` secrets, end to end: a receiver on 127.0.0.1:0
//! that echoes every request header (Authorization and the signature headers) into
//! its reply, and into an error body with a 400, gets no secret value nor any common
//! encoding of it into the stored evidence, the step's error, or anything the worker
//! prints; a secret bound to no host is never sent; a bound secret that is unset or
//! too short stops the worker at start, naming the variable.

mod cli_support;

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine as _;
use cli_support::Db;
use serde_json::{json, Map, Value};
use std::process::Output;
use std::sync::{Arc, Mutex};

const TOKEN: &str = "LEASEHOLD_SECRET_CLI_TOKEN";
const WHSEC: &str = "LEASEHOLD_SECRET_CLI_WHSEC";
const AUTH: &str = "Bearer cli-t0ken/with+odd\"chars";
const KEY: &[u8] = b"cli-signing-key-of-32-bytes!!!!!";

/// Every request's headers, as the server saw them.
type Seen = Arc<Mutex<Vec<HeaderMap>>>;

/// Every header of a request, as a JSON object.
fn headers_json(headers: &HeaderMap) -> Value {
    let map: Map<String, Value> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), json!(String::from_utf8_lossy(v.as_bytes()))))
        .collect();
    Value::Object(map)
}

/// The Authorization value in base64 (standard and URL-safe) and as sent.
fn auth_echo(headers: &HeaderMap) -> Value {
    let auth = headers
        .get("authorization")
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    json!({
        "auth": String::from_utf8_lossy(&auth),
        "b64": STANDARD.encode(&auth),
        "b64url": URL_SAFE_NO_PAD.encode(&auth),
    })
}

/// Starts the echoing server on its own thread: `/echo` answers 201 with every
/// header, `/reject` answers 400 with the same; answers its port.
fn server() -> (u16, Seen) {
    let seen = Seen::default();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (echo_seen, reject_seen) = (Arc::clone(&seen), Arc::clone(&seen));
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let app = Router::new()
                .route(
                    "/echo",
                    post(move |headers: HeaderMap| async move {
                        echo_seen.lock().unwrap().push(headers.clone());
                        let body = json!({"id": auth_echo(&headers)["auth"], "you_sent": headers_json(&headers), "encoded": auth_echo(&headers)});
                        (StatusCode::CREATED, axum::Json(body)).into_response()
                    }),
                )
                .route(
                    "/reject",
                    post(move |headers: HeaderMap| async move {
                        reject_seen.lock().unwrap().push(headers.clone());
                        let body = format!("{} {}", auth_echo(&headers), headers_json(&headers));
                        (StatusCode::BAD_REQUEST, body).into_response()
                    }),
                );
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (port, seen)
}

impl Db {
    /// Runs leasehold with only `env` of the secret variables set.
    fn run_with(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut command = self.cmd(args);
        command
            .env_remove("LEASEHOLD_HTTP_ALLOW")
            .env_remove("LEASEHOLD_HTTP_SECRET")
            .env_remove(TOKEN)
            .env_remove(WHSEC);
        command.envs(env.iter().copied());
        command.output().unwrap()
    }

    /// Enqueues an attempt of a plan whose steps post to each path with both
    /// secrets; answers the attempt id.
    fn enqueue(&self, port: u16, paths: &[&str]) -> String {
        let mut plan = "name = \"echo\"\nrecovery = \"resume\"\n".to_owned();
        for (n, path) in paths.iter().enumerate() {
            plan.push_str(&format!(
                "\n[[steps]]\ncode = \"step-{n}\"\nexecutor = \"http:v1\"\n\n[steps.payload]\n\
                 url = \"http://127.0.0.1:{port}/{path}\"\nbody = {{ n = {n} }}\nauth_env = \"{TOKEN}\"\n\
                 secret_env = \"{WHSEC}\"\nevidence = [\"\", \"/you_sent\", \"/id\"]\n"
            ));
        }
        let file = self.dir.path().join("echo.toml");
        std::fs::write(&file, plan).unwrap();
        let out = self.ok(&["plan", "add", file.to_str().unwrap()]);
        let id = out.split_whitespace().next().unwrap().to_owned();
        self.ok(&["enqueue", &id]).trim().to_owned()
    }
}

fn whsec() -> String {
    format!("whsec_{}", STANDARD.encode(KEY))
}

/// Every form of the secrets that must not show, computed independently of the
/// executor.
fn forbidden() -> Vec<String> {
    let credential = AUTH.split_once(' ').unwrap().1;
    let mut forms = Vec::new();
    for secret in [AUTH.as_bytes(), credential.as_bytes(), whsec().as_bytes(), KEY] {
        for engine in [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD] {
            forms.push(engine.encode(secret));
        }
        if let Ok(text) = std::str::from_utf8(secret) {
            let json = serde_json::to_string(text).unwrap();
            forms.push(text.to_owned());
            forms.push(json[1..json.len() - 1].to_owned());
        }
    }
    forms
}

fn assert_clean(what: &str, text: &str) {
    for form in forbidden() {
        assert!(!text.contains(&form), "{what} shows the secret form {form:?}:\n{text}");
    }
}

#[test]
fn an_echoing_receiver_gets_no_secret_into_stored_evidence_errors_or_output() {
    let (port, seen) = server();
    let db = Db::new();
    let attempt = db.enqueue(port, &["echo", "reject"]);
    let bindings = format!("{TOKEN}=127.0.0.1:{port},{WHSEC}=127.0.0.1:{port}");
    let allow = format!("127.0.0.1:{port}");
    let whsec = whsec();
    let worker = db.run_with(
        &[
            "worker",
            "--until-idle",
            "--http-allow",
            &allow,
            "--http-secret",
            &bindings,
        ],
        &[(TOKEN, AUTH), (WHSEC, &whsec)],
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&worker.stdout),
        String::from_utf8_lossy(&worker.stderr),
    );
    assert!(worker.status.success(), "{stderr}");
    assert_eq!(seen.lock().unwrap().len(), 2, "both steps reached the receiver");
    assert_eq!(seen.lock().unwrap()[0]["authorization"].as_bytes(), AUTH.as_bytes());
    assert!(
        stdout.contains("failed: step 2: step step-1: 127.0.0.1 answered 400"),
        "{stdout}"
    );
    assert_clean("the worker's stdout", &stdout);
    assert_clean("the worker's stderr", &stderr);
    let status = db.ok(&["status", &attempt, "--json"]);
    assert_clean("the stored attempt", &status);
    let status: Value = serde_json::from_str(&status).unwrap();
    let marker = format!("[redacted {TOKEN}]");
    let evidence: Value = serde_json::from_str(status["receipts"][0]["evidence"].as_str().unwrap()).unwrap();
    assert_eq!(
        evidence["fields"]["/you_sent"]["authorization"],
        marker.as_str(),
        "{evidence}"
    );
    assert_eq!(evidence["fields"]["/id"], marker.as_str());
    let error = status["receipts"][1]["error"].as_str().unwrap();
    assert!(error.contains(&marker), "the echo is in the error, redacted: {error}");
    let text = db.ok(&["status", &attempt]);
    assert_clean("the status text", &text);
}

#[test]
fn a_secret_bound_to_no_host_is_never_sent() {
    let (port, seen) = server();
    let db = Db::new();
    let attempt = db.enqueue(port, &["echo"]);
    let whsec = whsec();
    let worker = db.run_with(
        &["worker", "--until-idle", "--http-allow", &format!("127.0.0.1:{port}")],
        &[(TOKEN, AUTH), (WHSEC, &whsec)],
    );
    assert!(worker.status.success(), "{}", String::from_utf8_lossy(&worker.stderr));
    assert!(seen.lock().unwrap().is_empty(), "the receiver saw no request");
    let status: Value = serde_json::from_str(&db.ok(&["status", &attempt, "--json"])).unwrap();
    let error = status["receipts"][0]["error"].as_str().unwrap();
    assert!(
        error.contains(&format!(
            "secret {TOKEN} may not be sent to 127.0.0.1:{port} (bound to: no host; bind it with --http-secret \
             {TOKEN}=127.0.0.1:{port})"
        )),
        "{error}"
    );
}

#[test]
fn a_bound_secret_unset_or_too_short_stops_the_worker_at_start_naming_it() {
    let db = Db::new();
    let binding = format!("{TOKEN}=127.0.0.1:9");
    let args = [
        "worker",
        "--until-idle",
        "--http-allow",
        "127.0.0.1:9",
        "--http-secret",
        &binding,
    ];
    for (env, why) in [
        (&[][..], format!("environment variable {TOKEN} is not set")),
        (
            &[(TOKEN, "zq9X")][..],
            format!("environment variable {TOKEN} is shorter than 8 bytes"),
        ),
    ] {
        let out = db.run_with(&args, env);
        assert_eq!(out.status.code(), Some(2), "{why}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.starts_with("error: --http-secret: ") && stderr.contains(&why),
            "{stderr}"
        );
        assert!(!stderr.contains("zq9X") && !String::from_utf8_lossy(&out.stdout).contains("zq9X"));
    }
    let out = db.run_with(&["worker", "--until-idle", "--http-secret", "CRM=127.0.0.1"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: --http-secret \"CRM=127.0.0.1\": "));
}
