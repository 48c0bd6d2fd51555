//! The console in a real headless Chromium, driven over WebDriver (chromedriver)
//! with fantoccini: log in, watch a RUNNING attempt update without a reload,
//! reconcile an expired lease from the keyboard and see it requeued, see a viewer
//! without action buttons, open the plan page, comparison and gate, pause live
//! polling and see it stop while the tab is hidden, and read the pages at phone
//! width and at 400 % zoom. A screenshot of each page is written under
//! `target/browser-screenshots/`.
//!
//! Runs when `LEASEHOLD_TEST_CHROMEDRIVER` names chromedriver (`.ci/run` sets it);
//! skipped, saying so, otherwise. `LEASEHOLD_TEST_CHROMIUM` names the browser
//! (default `/usr/bin/chromium`).

#[path = "serve_common.rs"]
mod common;

use common::{now, wait_until, TestServer};
use fantoccini::{Client, ClientBuilder, Locator};
use leasehold::ledger::Ledger;
use leasehold_engine::{AttemptId, CommandStatus};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

/// chromedriver, killed when dropped.
struct Driver(std::process::Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// chromedriver on a port it picked (`--port=0`), read from its first lines. One that
/// exits before it says its port (seen once on a loaded machine, while another test
/// started its own) is started once more; one that says nothing in time fails the test.
fn start_chromedriver(path: &str) -> (Driver, u16) {
    match try_chromedriver(path) {
        Ok(started) => started,
        Err(first) => try_chromedriver(path)
            .unwrap_or_else(|again| panic!("chromedriver did not say its port: {first}, then {again}")),
    }
}

/// One start of chromedriver: its port, or why it said none.
fn try_chromedriver(path: &str) -> Result<(Driver, u16), std::sync::mpsc::RecvTimeoutError> {
    use std::io::BufRead;
    let mut child = std::process::Command::new(path)
        .arg("--port=0")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start chromedriver {path}: {e}"));
    let stdout = child.stdout.take().expect("stdout");
    let driver = Driver(child);
    let (tx, rx) = std::sync::mpsc::channel();
    // Reads every line, so that chromedriver never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("started successfully on port ").nth(1) {
                let _ = tx.send(rest.trim_end_matches('.').trim().parse::<u16>().ok());
            }
        }
    });
    let port = rx.recv_timeout(WAIT)?.expect("chromedriver's port is a number");
    Ok((driver, port))
}

async fn browser(port: u16, profile: &std::path::Path) -> Client {
    let chromium = std::env::var("LEASEHOLD_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([format!("--user-data-dir={}", profile.display())])
    .collect::<Vec<_>>();
    let mut caps = serde_json::Map::new();
    caps.insert("goog:chromeOptions".into(), json!({"binary": chromium, "args": args}));
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a WebDriver session")
}

fn screenshot_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .join("browser-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

/// Saves a screenshot of the whole page (the window grown to the page's height,
/// then put back).
async fn shot(client: &Client, name: &str) {
    let (width, height) = client.get_window_size().await.expect("window size");
    let (width, height) = (
        u32::try_from(width).unwrap_or(1280),
        u32::try_from(height).unwrap_or(900),
    );
    let page = js(client, "return document.documentElement.scrollHeight;")
        .await
        .as_u64()
        .unwrap_or(0);
    let tall = u32::try_from(page).unwrap_or(u32::MAX).saturating_add(100).min(4000);
    if tall > height {
        client.set_window_size(width, tall).await.expect("grow the window");
    }
    let png = client.screenshot().await.expect("screenshot");
    if tall > height {
        client.set_window_size(width, height).await.expect("restore the window");
    }
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(screenshot_dir().join(format!("{name}.png")), png).expect("write screenshot");
}

async fn js(client: &Client, script: &str) -> Value {
    client.execute(script, vec![]).await.expect("script")
}

/// Waits until the page's text contains `text` (re-reading the DOM, no reload).
async fn wait_for_text(client: &Client, selector: &str, text: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(e) = client.find(Locator::Css(selector)).await {
            if e.text().await.unwrap_or_default().contains(text) {
                return;
            }
        }
        assert!(Instant::now() < deadline, "no {text:?} in {selector} within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for_url(client: &Client, part: &str) {
    let deadline = Instant::now() + WAIT;
    while !client.current_url().await.expect("url").as_str().contains(part) {
        if Instant::now() > deadline {
            let url = client.current_url().await.expect("url");
            let text = js(client, "return document.body.innerText;").await;
            panic!("the URL never contained {part:?}: at {url}, showing {text}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn log_in(client: &Client, base: &str, token: &str) {
    client.goto(&format!("{base}/login")).await.unwrap();
    let form = client.form(Locator::Css("form.login")).await.unwrap();
    form.set_by_name("token", token).await.unwrap();
    form.submit().await.unwrap();
    wait_for_url(client, "/attempts").await;
}

/// No horizontal scrolling of the page itself (wide tables scroll in their region).
/// Clicks the element `css` selects.
async fn click(client: &Client, css: &str) {
    client.find(Locator::Css(css)).await.unwrap().click().await.unwrap();
}

async fn fits_the_width(client: &Client) -> bool {
    js(
        client,
        "return document.documentElement.scrollWidth <= window.innerWidth + 1;",
    )
    .await
        == json!(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_works_in_a_real_browser() {
    let Ok(driver) = std::env::var("LEASEHOLD_TEST_CHROMEDRIVER") else {
        eprintln!("skipped: LEASEHOLD_TEST_CHROMEDRIVER is not set (path of chromedriver; .ci/run sets it)");
        return;
    };
    let server = TestServer::start().await;
    let base = server.base.clone();
    // A plan with two delivered attempts: comparison and gate have something to show.
    let payments = server.plan("payments", 2).await;
    // The second delivered a different amount: the comparison drifts and the gate blocks.
    for amount in [42, 43] {
        server.enqueue(&payments).await;
        let c = server.claim(60_000).await;
        for ordinal in 1..=2 {
            server
                .ledger
                .complete_and_continue(
                    &c.lease,
                    ordinal,
                    &json!({"amount": amount, "step": ordinal}),
                    &json!({}),
                    60_000,
                )
                .await
                .unwrap();
        }
    }
    // A RUNNING attempt with a live lease, at its first of three steps.
    let live_plan = server.plan("ledger-sync", 3).await;
    let running = server.enqueue(&live_plan).await.attempt.id;
    let live = server.claim(120_000).await;
    // A QUEUED one.
    let queued_plan = server.plan("invoices", 1).await;
    server.enqueue(&queued_plan).await;

    let (_driver, port) = start_chromedriver(&driver);
    let profile = tempfile::tempdir().unwrap();
    let client = browser(port, profile.path()).await;

    // Log in.
    client.goto(&format!("{base}/login")).await.unwrap();
    shot(&client, "login").await;
    log_in(&client, &base, &server.operator).await;

    // The attempts list labels QUEUED and RUNNING distinctly, with counts.
    wait_for_text(&client, "#live", "RUNNING").await;
    let running_badge = client.find(Locator::Css("td .badge.running")).await.unwrap();
    let queued_badge = client.find(Locator::Css("td .badge.queued")).await.unwrap();
    assert!(running_badge.text().await.unwrap().contains("RUNNING"));
    assert!(queued_badge.text().await.unwrap().contains("QUEUED"));
    assert_ne!(
        running_badge.css_value("color").await.unwrap(),
        queued_badge.css_value("color").await.unwrap()
    );
    let counts = client
        .find(Locator::Css(".counts"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        counts.contains("SUCCEEDED 2") && counts.contains("RUNNING 1") && counts.contains("QUEUED 1"),
        "{counts}"
    );
    shot(&client, "attempts").await;

    // A RUNNING attempt updates in place: no reload.
    client.goto(&format!("{base}/attempts/{running}")).await.unwrap();
    wait_for_text(&client, "#live", "in doubt").await;
    js(&client, "window.__noReload = 'still here'; return null;").await;
    server
        .ledger
        .complete_and_continue(&live.lease, 1, &json!({"synced": 1}), &json!({}), 120_000)
        .await
        .unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let statuses = js(
            &client,
            "return Array.from(document.querySelectorAll('#live tbody tr')).map(r => r.cells[3].textContent);",
        )
        .await;
        let s: Vec<String> = serde_json::from_value(statuses).unwrap();
        if s.len() == 3 && s[0].contains("SUCCEEDED") && s[1].contains("RUNNING") {
            break;
        }
        assert!(Instant::now() < deadline, "step 1 never showed SUCCEEDED: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        js(&client, "return window.__noReload || null;").await,
        json!("still here")
    );
    assert!(
        client.find(Locator::Css("a.button.abort")).await.is_ok(),
        "an operator may abort an open attempt"
    );
    assert!(
        client.find(Locator::Css("a.button.reconcile")).await.is_err(),
        "no reconcile while the lease is live"
    );
    shot(&client, "attempt-running").await;

    // Pausing stops the polling; a hidden tab polls not at all.
    let toggle = client.find(Locator::Id("live-toggle")).await.unwrap();
    toggle.click().await.unwrap();
    assert_eq!(toggle.attr("aria-pressed").await.unwrap().as_deref(), Some("true"));
    assert_eq!(
        js(&client, "return document.documentElement.dataset.livePolling;").await,
        json!("false")
    );
    toggle.click().await.unwrap();
    assert_eq!(
        js(&client, "return document.documentElement.dataset.livePolling;").await,
        json!("true")
    );
    js(
        &client,
        "window.__hidden = []; document.addEventListener('visibilitychange', function () { \
           window.__hidden.push([document.visibilityState, document.documentElement.dataset.livePolling]); }); return null;",
    )
    .await;
    let first = client.window().await.unwrap();
    let other = client.new_window(true).await.unwrap();
    client.switch_to_window(other.handle.clone()).await.unwrap();
    client.goto(&format!("{base}/plans")).await.unwrap();
    client.close_window().await.unwrap();
    client.switch_to_window(first).await.unwrap();
    let log = js(&client, "return window.__hidden;").await;
    let log: Vec<(String, String)> = serde_json::from_value(log).unwrap();
    let (_, polling) = log
        .iter()
        .find(|(state, _)| state == "hidden")
        .unwrap_or_else(|| panic!("the tab was never hidden behind the other: {log:?}"));
    assert_eq!(polling, "false", "polling stopped while hidden: {log:?}");
    assert!(
        log.iter()
            .any(|(state, polling)| state == "visible" && polling == "true"),
        "and resumed: {log:?}"
    );

    // Reconcile an expired lease, from the keyboard, and see it requeued.
    // (The claim takes the oldest claimable command: the QUEUED "invoices" attempt.)
    let mut claimed = server.ledger.claim_and_begin("gone-worker", 1, 200).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let expired = claimed.remove(0).lease.attempt_id;
    let id = expired.clone();
    wait_until("the lease to expire", WAIT, || async {
        let r = server.ledger.attempt(&id).await.unwrap();
        r.command.lease_until.is_some_and(|u| u < now())
    })
    .await;
    client.goto(&format!("{base}/attempts/{expired}")).await.unwrap();
    wait_for_text(&client, "#live", "expired").await;
    shot(&client, "attempt-expired").await;
    click(&client, "a.button.reconcile").await;
    wait_for_url(&client, "/confirm?action=reconcile").await;
    shot(&client, "confirm-reconcile").await;
    // The confirmation button has the focus: Enter confirms.
    let focused = client.active_element().await.unwrap();
    assert_eq!(focused.text().await.unwrap(), "Yes, reconcile");
    focused.send_keys("\u{E007}").await.unwrap();
    wait_for_url(&client, "done=").await;
    wait_for_text(&client, ".notice", "Requeued").await;
    wait_for_text(&client, "#live", "QUEUED").await;
    let record = server.ledger.attempt(&AttemptId::new(expired.as_str())).await.unwrap();
    assert_eq!(record.command.status, CommandStatus::Pending);
    shot(&client, "attempt-requeued").await;

    // The plan page: gate checks first, then the evidence history, then comparison.
    client.goto(&format!("{base}/plans/{}", payments.id)).await.unwrap();
    let order = js(
        &client,
        "return Array.from(document.querySelectorAll('main h2')).map(h => h.id);",
    )
    .await;
    assert_eq!(order, json!(["gate", "history", "compare"]));
    wait_for_text(&client, "#gate", "Release gate BLOCK").await;
    wait_for_text(&client, "main table", "matches-baseline").await;
    shot(&client, "plan").await;
    client
        .form(Locator::Css("form[action$='/compare']"))
        .await
        .unwrap()
        .submit()
        .await
        .unwrap();
    wait_for_url(&client, "/compare?").await;
    wait_for_text(&client, "main h1", "Comparison DRIFT").await;
    let fields = js(&client, "return Array.from(document.querySelectorAll('main table')[1].querySelectorAll('tbody tr')).map(r => [r.cells[0].textContent, r.cells[2].textContent, r.cells[3].textContent]);").await;
    let fields: Vec<(String, String, String)> = serde_json::from_value(fields).unwrap();
    assert_eq!(fields.len(), 2, "{fields:?}");
    assert!(
        fields
            .iter()
            .all(|(path, l, r)| path.ends_with("/evidence/amount") && l == "42" && r == "43"),
        "{fields:?}"
    );
    shot(&client, "comparison").await;
    client
        .goto(&format!("{base}/plans/{}/gate", payments.id))
        .await
        .unwrap();
    wait_for_text(&client, "main h1", "Release gate").await;
    let order = js(
        &client,
        "return Array.from(document.querySelectorAll('main h2')).map(h => h.id);",
    )
    .await;
    assert_eq!(order[0], json!("checks"));
    shot(&client, "gate").await;
    client.goto(&format!("{base}/plans")).await.unwrap();
    shot(&client, "plans").await;

    // A viewer sees no action, even on an open attempt.
    click(&client, "form[action='/logout'] button").await;
    wait_for_url(&client, "/login").await;
    log_in(&client, &base, &server.viewer).await;
    client.goto(&format!("{base}/attempts/{running}")).await.unwrap();
    wait_for_text(&client, "#live", "RUNNING").await;
    assert!(
        client.find(Locator::Css(".actions")).await.is_err(),
        "a viewer has no action buttons"
    );
    assert!(client.find(Locator::Css("a[href*='/confirm']")).await.is_err());
    shot(&client, "attempt-viewer").await;

    // Phone width and 400 % zoom (a 1280 px window at 400 % is 320 CSS px wide).
    for (name, width) in [("phone-attempts", 390), ("zoom-400-attempts", 320)] {
        client.set_window_size(width, 800).await.unwrap();
        client.goto(&format!("{base}/attempts")).await.unwrap();
        wait_for_text(&client, "#live", "RUNNING").await;
        assert!(fits_the_width(&client).await, "{name}: the page scrolls sideways");
        shot(&client, name).await;
    }
    client.goto(&format!("{base}/attempts/{running}")).await.unwrap();
    assert!(
        fits_the_width(&client).await,
        "the attempt page scrolls sideways at 320 px"
    );
    shot(&client, "zoom-400-attempt").await;
    client.set_window_size(1280, 900).await.unwrap();
    client.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_policy_and_bulk_recovery_in_a_real_browser() {
    let Ok(driver) = std::env::var("LEASEHOLD_TEST_CHROMEDRIVER") else {
        eprintln!("skipped: LEASEHOLD_TEST_CHROMEDRIVER is not set (path of chromedriver; .ci/run sets it)");
        return;
    };
    let server = TestServer::start().await;
    let base = server.base.clone();
    // Two exhausted attempts, and one given back with deliveries left (next in 10 min).
    let exhausted = server.exhausted("one-shot", "connection refused").await;
    let other = server.exhausted("also-one-shot", "connection refused").await;
    let flaky = server.plan_with_retry("flaky", 1, 5).await;
    let waiting = server.enqueue(&flaky).await.attempt.id;
    let lease = server.claim(60_000).await.lease;
    server.give_back(&lease, "503 Service Unavailable", 600_000).await;

    let (_driver, port) = start_chromedriver(&driver);
    let profile = tempfile::tempdir().unwrap();
    let client = browser(port, profile.path()).await;
    log_in(&client, &base, &server.operator).await;

    // An exhausted attempt leads with its reason, before the outbox details.
    client
        .goto(&format!("{base}/attempts/{}", exhausted.attempt.id))
        .await
        .unwrap();
    wait_for_text(&client, ".exhausted", "exhausted: deliveries").await;
    wait_for_text(&client, ".exhausted", "connection refused").await;
    assert_eq!(
        js(
            &client,
            "const e = document.querySelector('.exhausted'), o = document.getElementById('outbox'); \
             return !!(e.compareDocumentPosition(o) & Node.DOCUMENT_POSITION_FOLLOWING);"
        )
        .await,
        json!(true),
        "the reason comes before the details"
    );
    shot(&client, "attempt-exhausted").await;

    // A given-back attempt: its next delivery, deliveries of the maximum, last error.
    client.goto(&format!("{base}/attempts/{waiting}")).await.unwrap();
    wait_for_text(&client, "#live .delivery", "Next delivery").await;
    let delivery = client
        .find(Locator::Css("#live .delivery"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        delivery.contains("in 9 min") || delivery.contains("in 10 min"),
        "{delivery}"
    );
    assert!(delivery.contains("1 of at most 5"), "{delivery}");
    assert!(delivery.contains("503 Service Unavailable"), "{delivery}");
    shot(&client, "attempt-given-back").await;

    // Bulk retry of the exhausted attempts: counted first, then done.
    click(&client, "nav a[href='/recovery']").await;
    wait_for_url(&client, "/recovery").await;
    shot(&client, "recovery").await;
    let reason = client
        .find(Locator::Css("#retry-form input[name='reason']"))
        .await
        .unwrap();
    reason.send_keys("exhausted\u{E007}").await.unwrap();
    wait_for_url(&client, "/recovery/confirm?").await;
    wait_for_text(&client, "#bulk-count", "selects 2").await;
    for record in [&exhausted, &other] {
        let history = server.ledger.history(&record.attempt.plan_id).await.unwrap();
        assert_eq!(history.len(), 1, "counting wrote nothing");
    }
    shot(&client, "recovery-confirm").await;
    let focused = client.active_element().await.unwrap();
    assert_eq!(focused.text().await.unwrap(), "Yes, retry 2 attempts");
    focused.send_keys("\u{E007}").await.unwrap();
    wait_for_text(&client, "#bulk-done", "Retry enqueued for 2").await;
    for record in [&exhausted, &other] {
        let history = server.ledger.history(&record.attempt.plan_id).await.unwrap();
        assert_eq!(history.len(), 2, "one retry each");
        assert_eq!(history[1].attempt.status, leasehold_engine::AttemptStatus::Queued);
    }
    shot(&client, "recovery-done").await;

    // Bulk abort of one plan's open attempts.
    client.goto(&format!("{base}/recovery")).await.unwrap();
    let plan = client
        .find(Locator::Css("#abort-form input[name='plan']"))
        .await
        .unwrap();
    plan.send_keys("flaky\u{E007}").await.unwrap();
    wait_for_text(&client, "#bulk-count", "selects 1").await;
    click(&client, "form[action='/recovery/act'] button").await;
    wait_for_text(&client, "#bulk-done", "Aborted for 1").await;
    let aborted = server.ledger.attempt(&waiting).await.unwrap();
    assert_eq!(aborted.attempt.status, leasehold_engine::AttemptStatus::Aborted);
    assert_eq!(aborted.attempt.error.as_deref(), Some("aborted in bulk by operator"));

    // At 400 % zoom the recovery page reflows.
    client.set_window_size(320, 800).await.unwrap();
    client.goto(&format!("{base}/recovery")).await.unwrap();
    assert!(
        fits_the_width(&client).await,
        "the recovery page scrolls sideways at 320 px"
    );
    shot(&client, "zoom-400-recovery").await;
    client.set_window_size(1280, 900).await.unwrap();

    // A viewer: no way to recovery, no action on an exhausted attempt.
    click(&client, "form[action='/logout'] button").await;
    wait_for_url(&client, "/login").await;
    log_in(&client, &base, &server.viewer).await;
    assert!(client.find(Locator::Css("nav a[href='/recovery']")).await.is_err());
    client
        .goto(&format!("{base}/attempts/{}", exhausted.attempt.id))
        .await
        .unwrap();
    wait_for_text(&client, ".exhausted", "exhausted: deliveries").await;
    assert!(client.find(Locator::Css(".actions")).await.is_err());
    client.goto(&format!("{base}/recovery")).await.unwrap();
    wait_for_text(&client, "main h1", "403").await;
    assert!(client.find(Locator::Css("form.recovery")).await.is_err());
    client.close().await.unwrap();
}
