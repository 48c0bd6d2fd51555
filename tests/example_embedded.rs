//! `examples/embedded.rs` runs in CI: its logic, run here on a temporary SQLite file,
//! delivers the committed order through the application's own executor and leaves
//! nothing of the rolled-back one.

#[path = "../examples/embedded.rs"]
#[allow(dead_code)] // the example's `main`, which `cargo run --example embedded` runs
mod embedded;

use leasehold::engine::{AttemptStatus, CommandStatus};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_example_delivers_the_committed_order_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.db");
    let outcome = embedded::run_shop(path.to_str().unwrap()).await.unwrap();

    assert_eq!(outcome.orders, ["o-1001"]);
    assert_eq!(outcome.deliveries.len(), 1, "{outcome}");
    let (order, attempt, command, crm_id) = &outcome.deliveries[0];
    assert_eq!(order, "o-1001");
    assert_eq!(
        (*attempt, *command),
        (AttemptStatus::Succeeded, CommandStatus::Delivered)
    );
    assert_eq!(crm_id, "crm-0001");
    assert_eq!(
        outcome.rolled_back,
        [("o-1002".to_owned(), "payment declined".to_owned())]
    );
    assert_eq!(
        outcome.outbox_rows,
        [1, 1, 1],
        "only the committed order's attempt, receipt and command"
    );
    assert_eq!(outcome.crm_orders, ["o-1001"]);
    assert_eq!(
        (outcome.worker.claimed, outcome.worker.delivered, outcome.worker.failed),
        (1, 1, 0)
    );
    let printed = outcome.to_string();
    assert!(
        printed.contains("order o-1001: committed; attempt SUCCEEDED, command DELIVERED, CRM id crm-0001"),
        "{printed}"
    );
    assert!(
        printed.contains("order o-1002: rolled back (payment declined)"),
        "{printed}"
    );
}
