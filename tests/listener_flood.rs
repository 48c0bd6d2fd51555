//! The listener's bounds tried as attacks, on `leasehold serve` (API and console,
//! and its metrics port) and `leasehold target`: half-open connections beyond the
//! connection cap, headers and bodies sent too slowly, a half-open connection held
//! across SIGTERM, a foreign `Host` (DNS rebinding), and a body sent before
//! authentication. Every attack targets 127.0.0.1 and ends by itself.

#[path = "serve_common.rs"]
mod common;

use leasehold::clock::SystemClock;
use leasehold::entropy::OsEntropy;
use leasehold::executor::Executors;
use leasehold::ledger::sqlite::SqliteLedger;
use leasehold::ledger::Ledger;
use leasehold::listener::{AllowedHosts, Config, Served};
use leasehold::receiver::sqlite::SqliteStore;
use leasehold::receiver::{Faults, Target};
use leasehold::serve::{App, Listeners, WorkerPool, BODY_LIMIT_BYTES};
use leasehold::tokens::Role;
use leasehold_engine::lease::WorkerConfig;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// The connection cap of the flood tests, and how many connections go beyond it.
const CAP: usize = 64;
const BEYOND: usize = 16;

// ---- raw HTTP/1.1 over loopback -------------------------------------------------

/// Opens a connection and sends a request head that never ends (a connection the
/// server refused at once may fail the write: it is returned all the same).
async fn half_open(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let _ = stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await;
    stream
}

/// Everything a connection reads until the server ends it (EOF or reset), or
/// `None` when it is still open after `bound`.
async fn read_until_closed(stream: &mut TcpStream, bound: Duration) -> Option<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + bound;
    let (mut got, mut buf) = (Vec::new(), [0u8; 8192]);
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// The status of an HTTP/1.1 reply, if `reply` starts with one.
fn status_of(reply: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(reply.get(..12)?).ok()?;
    line.strip_prefix("HTTP/1.1 ")?.parse().ok()
}

/// Sends `head` and `body` on a new connection and answers the reply's status
/// (`None`: refused or closed without a reply, or no reply within 10 s).
async fn exchange(addr: SocketAddr, head: &str, body: &[u8]) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    stream.write_all(head.as_bytes()).await.ok()?;
    stream.write_all(body).await.ok()?;
    status_of(&read_until_closed(&mut stream, Duration::from_secs(10)).await?)
}

/// A complete GET of `path` naming `host`, closing the connection after.
fn get(path: &str, host: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
}

// ---- servers in this process ----------------------------------------------------

/// A server in this process, stopped by [`InProcess::stop`].
struct InProcess {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    done: JoinHandle<Served>,
    _dir: Option<tempfile::TempDir>,
}

impl InProcess {
    /// The reference receiver over an in-memory store.
    async fn target(config: Config) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let target = Target::new(SqliteStore::open(":memory:").expect("store"), Faults::none());
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(async move {
            let stopped = async move {
                let _ = stopped.await;
            };
            target.serve_with(listener, config, stopped).await.expect("serve")
        });
        Self {
            addr,
            stop,
            done,
            _dir: None,
        }
    }

    /// `serve::run` over a SQLite ledger, without workers.
    async fn serve(config: Config) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ledger.db").display().to_string();
        let ledger = Arc::new(SqliteLedger::open(&path, Arc::new(SystemClock), Arc::new(OsEntropy)).expect("open"));
        ledger.migrate().await.expect("migrate");
        let executors = Arc::new(Executors::new());
        let app = App::new(Arc::clone(&ledger), &executors.names());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let pool = WorkerPool {
            workers: 0,
            config: WorkerConfig::clamped(false, 1_000, 1, 60_000),
            id: "flood".into(),
            grace_ms: config.grace.as_millis() as u64,
            step_timeout: Duration::from_secs(5),
        };
        let listeners = Listeners {
            api: listener,
            metrics: None,
            config,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let stopped = async move {
            let _ = stopped.await;
        };
        let run = leasehold::serve::run(app, ledger, executors, listeners, pool, stopped);
        let done = tokio::spawn(async move { run.await.expect("serve").api });
        Self {
            addr,
            stop,
            done,
            _dir: Some(dir),
        }
    }

    /// Stops the server and answers what its listener counted.
    async fn stop(self) -> Served {
        let _ = self.stop.send(());
        self.done.await.expect("the server's task")
    }
}

/// A small cap and a header timeout long enough to tell the held connections from
/// the refused ones, short enough for the test to see the slots freed.
fn flood_config() -> Config {
    Config {
        max_connections: CAP,
        header_timeout: Duration::from_secs(6),
        ..Config::default()
    }
}

/// Opens `CAP + BEYOND` half-open connections to `addr`; asserts that exactly `CAP`
/// are held and the rest refused at once, that a complete request meanwhile is
/// refused at once, and that it is answered once the header timeout frees the
/// slots. Answers how many connections were held at the cap.
async fn flood(addr: SocketAddr, path: &str) -> usize {
    let mut opened = Vec::new();
    for _ in 0..CAP + BEYOND {
        opened.push(half_open(addr).await);
    }
    let window = Duration::from_secs(2);
    let reads: Vec<_> = opened
        .into_iter()
        .map(|mut c| tokio::spawn(async move { (read_until_closed(&mut c, window).await, c) }))
        .collect();
    let (mut held, mut refused) = (Vec::new(), 0);
    for read in reads {
        match read.await.expect("read task") {
            (None, c) => held.push(c),
            (Some(reply), _) => {
                assert!(reply.is_empty() || status_of(&reply) == Some(503), "{reply:?}");
                refused += 1;
            }
        }
    }
    assert_eq!((held.len(), refused), (CAP, BEYOND), "held and refused at the cap");
    let asked = Instant::now();
    let at_cap = exchange(addr, &get(path, "127.0.0.1"), b"").await;
    assert!(matches!(at_cap, None | Some(503)), "at the cap: {at_cap:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "refused at once: {:?}",
        asked.elapsed()
    );
    let deadline = Instant::now() + flood_config().header_timeout + Duration::from_secs(20);
    while exchange(addr, &get(path, "127.0.0.1"), b"").await != Some(200) {
        assert!(Instant::now() < deadline, "not answered after the header timeout");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let count = held.len();
    for mut c in held {
        let closed = read_until_closed(&mut c, Duration::from_secs(10)).await;
        assert!(closed.is_some(), "a held connection outlived the header timeout");
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_holds_at_most_its_cap_of_half_open_connections_and_answers_once_they_time_out() {
    let server = InProcess::serve(flood_config()).await;
    let held = flood(server.addr, "/api/v1/healthz").await;
    let served = server.stop().await;
    println!("serve: {held} half-open connections held at --max-connections {CAP}; {served:?}");
    assert!(served.refused > BEYOND as u64, "{served:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receiver_holds_at_most_its_cap_of_half_open_connections_and_answers_once_they_time_out() {
    let target = InProcess::target(flood_config()).await;
    let held = flood(target.addr, "/effects").await;
    let served = target.stop().await;
    println!("target: {held} half-open connections held at --max-connections {CAP}; {served:?}");
    assert!(served.refused > BEYOND as u64, "{served:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_sent_too_slowly_and_an_idle_keep_alive_connection_are_closed() {
    let config = Config {
        header_timeout: Duration::from_secs(1),
        ..Config::default()
    };
    let target = InProcess::target(config).await;
    // Slow headers: a header line every 200 ms, never the blank line that ends them.
    let mut slow = TcpStream::connect(target.addr).await.unwrap();
    slow.write_all(b"GET /effects HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let (mut reader, mut writer) = slow.into_split();
    let trickle = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tick.tick().await;
            if writer.write_all(b"X-Slow: 1\r\n").await.is_err() {
                return;
            }
        }
    });
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while matches!(reader.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await;
    assert!(ended.is_ok(), "slow headers were still read after 5 s");
    println!("slow headers closed after {:?}", started.elapsed());
    trickle.abort();
    // Idle keep-alive: one request answered, then nothing.
    let mut idle = TcpStream::connect(target.addr).await.unwrap();
    idle.write_all(b"GET /effects HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let reply = read_until_closed(&mut idle, Duration::from_secs(5)).await;
    let reply = reply.expect("the idle keep-alive connection was closed");
    assert_eq!(status_of(&reply), Some(200));
    target.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_too_slowly_is_answered_408() {
    let config = Config {
        request_timeout: Duration::from_secs(1),
        ..Config::default()
    };
    let target = InProcess::target(config).await;
    let mut stream = TcpStream::connect(target.addr).await.unwrap();
    let head = "POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: slow-1\r\nContent-Length: 100\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(b"0123456789").await.unwrap();
    let started = Instant::now();
    let reply = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    let reply = reply.expect("the slow body's connection was closed");
    assert_eq!(status_of(&reply), Some(408), "{}", String::from_utf8_lossy(&reply));
    println!("slow body answered 408 after {:?}", started.elapsed());
    target.stop().await;
}

// ---- processes ----------------------------------------------------------------

/// A `leasehold` child, killed if the test ends early, with its stdout lines.
struct Process {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    fn start(db: &str, args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(args)
            .env("LEASEHOLD_DB", db)
            .env_remove("LEASEHOLD_PUBLIC_ORIGIN")
            .env_remove("LEASEHOLD_HTTP_ALLOW")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start leasehold");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self { child, lines }
    }

    /// The address in the first stdout line starting with `prefix` (within 30 s):
    /// `prefix` is followed by `http://ADDR` and, maybe, a path.
    fn addr_after(&self, prefix: &str) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).expect("a line naming the address");
            if let Some(rest) = line.strip_prefix(prefix) {
                let rest = rest.trim_start().trim_start_matches("http://");
                let addr = rest.split(['/', ' ', ',', ';']).next().unwrap_or_default();
                return addr.parse().unwrap_or_else(|_| panic!("no address in {line:?}"));
            }
        }
    }

    /// SIGTERM, then how long the process took to exit (at most `bound`).
    fn terminate_within(&mut self, bound: Duration) -> Duration {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let sent = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "{status:?}");
                return sent.elapsed();
            }
            assert!(sent.elapsed() < bound, "still running {bound:?} after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn scratch_db(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("ledger.db").display())
}

/// Holds a half-open connection (and a keep-alive one mid-request) to `addr`, then
/// SIGTERMs `process`: it must exit within its grace period plus `slack`, well
/// before the 10 s header timeout would have freed the connection.
async fn sigterm_with_a_half_open_connection(mut process: Process, addr: SocketAddr, grace: Duration) {
    let mut stuck = half_open(addr).await;
    let slack = Duration::from_secs(4);
    let took = tokio::task::spawn_blocking(move || process.terminate_within(grace + slack))
        .await
        .unwrap();
    println!("exited {took:?} after SIGTERM (grace {grace:?})");
    let closed = read_until_closed(&mut stuck, Duration::from_secs(2)).await;
    assert!(closed.is_some(), "the half-open connection outlived the process");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_connection_does_not_keep_serve_running_past_its_grace() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Process::start(
        &scratch_db(&dir),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "0",
            "--grace-secs",
            "2",
        ],
    );
    let addr = serve.addr_after("serving the console at");
    sigterm_with_a_half_open_connection(serve, addr, Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_connection_does_not_keep_the_receiver_running_past_its_grace() {
    let target = Process::start(
        "sqlite::memory:",
        &["target", "--listen", "127.0.0.1:0", "--grace-secs", "1"],
    );
    let addr = target.addr_after("leasehold target listening on");
    sigterm_with_a_half_open_connection(target, addr, Duration::from_secs(1)).await;
}

// ---- Host (DNS rebinding) ------------------------------------------------------

/// `path` on `addr` is answered for an IP literal, localhost and `origin_host`,
/// and 421 for a foreign name, a missing Host and a foreign absolute URI.
async fn only_its_own_hosts_are_answered(addr: SocketAddr, path: &str, origin_host: &str) {
    let port = addr.port();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "[::1]".to_owned(),
        origin_host.to_owned(),
    ] {
        assert_eq!(
            exchange(addr, &get(path, &host), b"").await,
            Some(200),
            "Host: {host} on {path}"
        );
    }
    for host in [
        "evil.example",
        &format!("evil.example:{port}"),
        "127.0.0.1.evil.example",
    ] {
        assert_eq!(
            exchange(addr, &get(path, host), b"").await,
            Some(421),
            "Host: {host} on {path}"
        );
    }
    let no_host = format!("GET {path} HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert_eq!(exchange(addr, &no_host, b"").await, Some(421), "no Host on {path}");
    let absolute = format!("GET http://evil.example{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    assert_eq!(
        exchange(addr, &absolute, b"").await,
        Some(421),
        "absolute URI on {path}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_and_its_metrics_port_answer_only_their_own_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Process::start(
        &scratch_db(&dir),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--workers",
            "0",
            "--public-origin",
            "https://ops.example.com",
        ],
    );
    let api = serve.addr_after("serving the console at");
    let metrics = serve.addr_after("serving /metrics without authentication at");
    only_its_own_hosts_are_answered(api, "/api/v1/healthz", "ops.example.com").await;
    only_its_own_hosts_are_answered(metrics, "/metrics", "ops.example.com:443").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receiver_answers_only_its_own_hosts() {
    let target = Process::start(
        "sqlite::memory:",
        &[
            "target",
            "--listen",
            "127.0.0.1:0",
            "--public-origin",
            "http://receiver.internal:8080",
        ],
    );
    let addr = target.addr_after("leasehold target listening on");
    only_its_own_hosts_are_answered(addr, "/effects", "receiver.internal:8080").await;
    let delivery = "POST /orders HTTP/1.1\r\nHost: evil.example\r\nIdempotency-Key: k-1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n";
    assert_eq!(exchange(addr, delivery, b"{}").await, Some(421));
    let effects = exchange(addr, &get("/effects", "127.0.0.1"), b"").await;
    assert_eq!(effects, Some(200));
}

#[test]
fn a_public_origin_with_a_path_or_another_scheme_is_refused_naming_the_flag() {
    for bad in [
        "https://ops.example.com/console",
        "ftp://ops.example.com",
        "ops.example.com",
    ] {
        let out = Command::new(BIN)
            .args(["target", "--listen", "127.0.0.1:0", "--public-origin", bad])
            .env("LEASEHOLD_DB", "sqlite::memory:")
            .env_remove("LEASEHOLD_PUBLIC_ORIGIN")
            .output()
            .expect("run leasehold");
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("--public-origin {bad:?}")), "{stderr}");
    }
    assert!(AllowedHosts::from_origins("--public-origin", ["https://ops.example.com"]).is_ok());
}

// ---- bodies and authentication ------------------------------------------------

/// A POST of `path` with these extra header lines, declaring `length` bytes.
fn post(path: &str, extra: &str, length: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}Content-Length: {length}\r\nConnection: close\r\n\r\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_body_is_read_before_authentication_and_an_authenticated_one_is_capped() {
    let server = common::TestServer::start().await;
    let addr: SocketAddr = server.base.trim_start_matches("http://").parse().unwrap();
    let declared = 10 * BODY_LIMIT_BYTES;
    for (path, extra) in [
        ("/api/v1/plans", ""),
        ("/api/v1/plans", "Authorization: Bearer lh_not_a_token\r\n"),
        ("/api/v1/tokens", ""),
        ("/api/v1/plans/p/attempts", ""),
    ] {
        // The body is declared and never sent: only a refusal from the headers
        // answers it.
        let asked = Instant::now();
        let status = exchange(addr, &post(path, extra, declared), b"").await;
        assert_eq!(status, Some(401), "{path} {extra:?}");
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "{path}: {:?}",
            asked.elapsed()
        );
    }
    let form = "POST /attempts/a-1/action HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000000\r\nConnection: close\r\n\r\n";
    let console = exchange(addr, form, b"").await;
    assert!(console.is_some_and(|s| s >= 300), "console action: {console:?}");
    let admin = format!("Authorization: Bearer {}\r\n", server.token(Role::Admin));
    let over = vec![b' '; BODY_LIMIT_BYTES + 1];
    let status = exchange(addr, &post("/api/v1/plans", &admin, over.len()), &over).await;
    assert_eq!(status, Some(413));
}
