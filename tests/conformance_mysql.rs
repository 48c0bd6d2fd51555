//! The ledger conformance suite, instantiated for the MySQL ledger against the server
//! at `LEASEHOLD_TEST_MYSQL_URL` (e.g. `mysql://root@127.0.0.1:3306/test`).
//!
//! Every test runs in a database of its own (`lh_test_<random>`, created for it and
//! dropped after), so the tests run in parallel; other handles are other ledgers
//! (other pools) on that database. Leases are decided on the suite's manual clock
//! ([`MysqlLedger::open_with_clock`]) instead of the database's. Without
//! `LEASEHOLD_TEST_MYSQL_URL` every test prints why it is skipped and passes.
//!
//! The suite runs twice: at the crate root with the default claim path (`SELECT …
//! FOR UPDATE SKIP LOCKED` where the server has it), and in [`portable`] with
//! `skip_locked=0`, the path that MySQL 5.7 takes.

#[path = "conformance/mod.rs"]
mod conformance;

use conformance::Harness;
use leasehold::clock::{Clock, ManualClock};
use leasehold::entropy::{Entropy, SeededEntropy};
use leasehold::ledger::mysql::scratch::ScratchDatabase;
use leasehold::ledger::mysql::{MysqlLedger, MysqlUrl};
use leasehold::ledger::Ledger;
use std::sync::Arc;

/// The variable that names the test server.
const URL_VAR: &str = "LEASEHOLD_TEST_MYSQL_URL";

/// The test server's URL, or `None` (with the reason printed) when it is not set.
fn admin_url() -> Option<MysqlUrl> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => Some(MysqlUrl::parse(&url).unwrap_or_else(|e| panic!("{URL_VAR}: {e}"))),
        _ => {
            println!("skipped: {URL_VAR} is not set (e.g. {URL_VAR}=mysql://root@127.0.0.1:3306/test)");
            None
        }
    }
}

/// A fresh, migrated MySQL ledger in a database of its own, deciding leases on
/// `clock`. Every handle shares the clock and one entropy source, so no two handles
/// mint the same id or lease token.
async fn mysql_ledger(clock: Arc<ManualClock>) -> Option<Harness<MysqlLedger>> {
    mysql_ledger_with(clock, true).await
}

/// Like [`mysql_ledger`], claiming with `SKIP LOCKED` only if `skip_locked` (and the
/// server has it).
async fn mysql_ledger_with(clock: Arc<ManualClock>, skip_locked: bool) -> Option<Harness<MysqlLedger>> {
    let admin = admin_url()?;
    let db = ScratchDatabase::create(&admin, "lh_test_")
        .await
        .unwrap_or_else(|e| panic!("cannot create a test database at {admin}: {e}"));
    let mut url = db.url().clone();
    url.options.skip_locked = skip_locked;
    let ledger_clock: Arc<dyn Clock> = clock.clone();
    let entropy: Arc<dyn Entropy> = Arc::new(SeededEntropy::new(0x1ea5e));
    let ledger = MysqlLedger::open_with_clock(&url, ledger_clock.clone(), entropy.clone());
    let applied = ledger.migrate().await.expect("migrate");
    assert!(!applied.is_empty(), "a fresh database must need migrations");
    assert_eq!(ledger.migrate().await.expect("migrate again"), Vec::<u32>::new());
    let open = move || {
        std::future::ready(MysqlLedger::open_with_clock(
            &url,
            ledger_clock.clone(),
            entropy.clone(),
        ))
    };
    Some(Harness::new(ledger, clock, open, db))
}

conformance_suite!(mysql_ledger);

/// The suite again on the portable claim path (`skip_locked=0`): a plain read of
/// candidates, then a locking re-check of each — what runs on MySQL 5.7.
mod portable {
    use super::*;

    async fn mysql_portable_ledger(clock: Arc<ManualClock>) -> Option<Harness<MysqlLedger>> {
        let harness = mysql_ledger_with(clock, false).await?;
        assert_eq!(harness.ledger.uses_skip_locked(), Some(false));
        Some(harness)
    }

    crate::conformance_suite!(mysql_portable_ledger);
}
