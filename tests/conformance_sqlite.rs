//! The ledger conformance suite, instantiated for the SQLite ledger (a file in a
//! temporary directory per test; other handles are separate opens of that file).

#[path = "conformance/mod.rs"]
mod conformance;

use conformance::Harness;
use leasehold::clock::{Clock, ManualClock};
use leasehold::entropy::{Entropy, SeededEntropy};
use leasehold::ledger::sqlite::SqliteLedger;
use leasehold::ledger::Ledger;
use std::sync::Arc;

/// A fresh, migrated SQLite ledger on `clock`. Every handle shares the clock and one
/// entropy source, so no two handles mint the same id or lease token.
async fn sqlite_ledger(clock: Arc<ManualClock>) -> Option<Harness<SqliteLedger>> {
    let dir = tempfile::TempDir::new().expect("temporary directory");
    let path = dir
        .path()
        .join("ledger.db")
        .to_str()
        .expect("a UTF-8 temporary path")
        .to_owned();
    let ledger_clock: Arc<dyn Clock> = clock.clone();
    let entropy: Arc<dyn Entropy> = Arc::new(SeededEntropy::new(0x1ea5e));
    let ledger = SqliteLedger::open(&path, ledger_clock.clone(), entropy.clone()).expect("open");
    let applied = ledger.migrate().await.expect("migrate");
    assert!(!applied.is_empty(), "a fresh database must need migrations");
    assert_eq!(ledger.migrate().await.expect("migrate again"), Vec::<u32>::new());
    let open = move || {
        let handle = SqliteLedger::open(&path, ledger_clock.clone(), entropy.clone()).expect("open another handle");
        std::future::ready(handle)
    };
    Some(Harness::new(ledger, clock, open, dir))
}

conformance_suite!(sqlite_ledger);
