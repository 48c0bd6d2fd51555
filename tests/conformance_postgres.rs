//! The ledger conformance suite, instantiated for the PostgreSQL ledger against the
//! server at `LEASEHOLD_TEST_POSTGRES_URL` (e.g. `postgres://postgres@127.0.0.1:5432/test`).
//!
//! Every test runs in a database of its own (`lh_test_<random>`, created for it and
//! dropped after), so the tests run in parallel; other handles are other ledgers
//! (other pools) on that database. Leases are decided on the suite's manual clock
//! ([`PostgresLedger::open_with_clock`]) instead of the database's. Without
//! `LEASEHOLD_TEST_POSTGRES_URL` every test prints why it is skipped and passes.

#[path = "conformance/mod.rs"]
mod conformance;

use conformance::Harness;
use leasehold::clock::{Clock, ManualClock};
use leasehold::entropy::{Entropy, SeededEntropy};
use leasehold::ledger::postgres::scratch::ScratchDatabase;
use leasehold::ledger::postgres::{PostgresLedger, PostgresUrl};
use leasehold::ledger::Ledger;
use std::sync::Arc;

/// The variable that names the test server.
const URL_VAR: &str = "LEASEHOLD_TEST_POSTGRES_URL";

/// The test server's URL, or `None` (with the reason printed) when it is not set.
fn admin_url() -> Option<PostgresUrl> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => Some(PostgresUrl::parse(&url).unwrap_or_else(|e| panic!("{URL_VAR}: {e}"))),
        _ => {
            println!("skipped: {URL_VAR} is not set (e.g. {URL_VAR}=postgres://postgres@127.0.0.1:5432/test)");
            None
        }
    }
}

/// A fresh, migrated PostgreSQL ledger in a database of its own, deciding leases on
/// `clock`. Every handle shares the clock and one entropy source, so no two handles
/// mint the same id or lease token.
async fn postgres_ledger(clock: Arc<ManualClock>) -> Option<Harness<PostgresLedger>> {
    let admin = admin_url()?;
    let db = ScratchDatabase::create(&admin, "lh_test_")
        .await
        .unwrap_or_else(|e| panic!("cannot create a test database at {admin}: {e}"));
    let url = db.url().clone();
    let ledger_clock: Arc<dyn Clock> = clock.clone();
    let entropy: Arc<dyn Entropy> = Arc::new(SeededEntropy::new(0x1ea5e));
    let ledger = PostgresLedger::open_with_clock(&url, ledger_clock.clone(), entropy.clone()).expect("open");
    let applied = ledger.migrate().await.expect("migrate");
    assert!(!applied.is_empty(), "a fresh database must need migrations");
    assert_eq!(ledger.migrate().await.expect("migrate again"), Vec::<u32>::new());
    let open = move || {
        std::future::ready(
            PostgresLedger::open_with_clock(&url, ledger_clock.clone(), entropy.clone()).expect("open a handle"),
        )
    };
    Some(Harness::new(ledger, clock, open, db))
}

conformance_suite!(postgres_ledger);
