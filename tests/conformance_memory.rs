//! The ledger conformance suite, instantiated for the in-memory reference ledger.

#[path = "conformance/mod.rs"]
mod conformance;

use conformance::Harness;
use leasehold::clock::ManualClock;
use leasehold::entropy::SeededEntropy;
use leasehold::ledger::memory::MemoryLedger;
use leasehold::ledger::Ledger;
use std::sync::Arc;

/// A fresh memory ledger on `clock`; other handles are clones (shared state).
async fn memory_ledger(clock: Arc<ManualClock>) -> Option<Harness<MemoryLedger>> {
    let ledger = MemoryLedger::new(clock.clone(), Arc::new(SeededEntropy::new(0x1ea5e)));
    ledger.migrate().await.expect("migrate");
    let shared = ledger.clone();
    Some(Harness::new(
        ledger,
        clock,
        move || std::future::ready(shared.clone()),
        (),
    ))
}

conformance_suite!(memory_ledger);
