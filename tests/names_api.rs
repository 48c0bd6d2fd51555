//! Names with invisible or separator characters sent to `leasehold serve`'s API are
//! refused with the field and the code point, and nothing is stored: a token whose
//! name hides a zero-width space, a plan whose name or step code does.
//!
//! The server is the real binary on 127.0.0.1, port 0; requests are plain HTTP/1.1
//! over a socket, each answered before the next is sent.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
const WAIT: Duration = Duration::from_secs(60);

/// A running `leasehold serve` with the admin token it printed.
struct Server {
    _dir: tempfile::TempDir,
    child: Child,
    addr: String,
    token: String,
}

impl Server {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let mut child = Command::new(BIN)
            .args(["--db", &url, "serve", "--listen", "127.0.0.1:0", "--workers", "0"])
            .env_remove("LEASEHOLD_DB")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut token, mut addr) = (None, None);
        while addr.is_none() {
            let line = lines.next().expect("serve printed its address").unwrap();
            if let Some(secret) = line.trim().strip_prefix("lh_") {
                token = Some(format!("lh_{secret}"));
            }
            if let Some(rest) = line.strip_prefix("serving the console at http://") {
                addr = rest.split('/').next().map(str::to_owned);
            }
        }
        Server {
            _dir: dir,
            child,
            addr: addr.unwrap(),
            token: token.expect("the first admin token"),
        }
    }

    /// Sends one request; answers the status code and the body as JSON.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        let body = body.map(Value::to_string).unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            self.token,
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let status = answer.split(' ').nth(1).unwrap().parse().unwrap();
        let (_, body) = answer.split_once("\r\n\r\n").unwrap();
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_token_name_with_a_zero_width_space_is_refused_by_the_api() {
    let server = Server::start();
    let (status, problem) = server.call(
        "POST",
        "/api/v1/tokens",
        Some(&json!({"name": "ci\u{200b}-bot", "role": "viewer"})),
    );
    assert_eq!(status, 400, "{problem}");
    assert_eq!(
        problem["detail"],
        "token name: must not contain invisible or separator characters (found U+200B)"
    );
    assert!(problem.get("token").is_none());
    let (status, tokens) = server.call("GET", "/api/v1/tokens", None);
    assert_eq!(status, 200);
    let names: Vec<&str> = tokens
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["admin"], "{tokens}");
}

#[test]
fn plans_with_invisible_characters_in_names_are_refused_by_the_api() {
    let server = Server::start();
    for (field, code_point, plan) in [
        (
            "name",
            "U+200B",
            json!({"name": "dry\u{200b}-run", "recovery": "resume", "steps": [{"code": "a", "executor": "dry-run:v1"}]}),
        ),
        (
            "steps[0].code",
            "U+2060",
            json!({"name": "p", "recovery": "resume", "steps": [{"code": "a\u{2060}", "executor": "dry-run:v1"}]}),
        ),
    ] {
        let (status, problem) = server.call("POST", "/api/v1/plans", Some(&plan));
        assert_eq!(status, 422, "{problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.ends_with(&format!(
                "{field}: must not contain invisible or separator characters (found {code_point})"
            )),
            "{detail}"
        );
    }
    let (status, plans) = server.call("GET", "/api/v1/plans", None);
    assert_eq!(status, 200);
    assert_eq!(plans, json!([]), "nothing was registered");
}
