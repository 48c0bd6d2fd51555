//! The ledger conformance suite, instantiated for the MySQL ledger against the server
//! at `LEASEHOLD_TEST_MYSQL_URL` (e.g. `mysql://root@127.0.0.1:3306/test`).
//!
//! Every test runs in a database of its own (`lh_test_<random>`, created for it and
//! dropped after), so the tests run in parallel; other handles are other ledgers
//! (other pools) on that database. Leases are decided on the suite's manual clock
//! ([`MysqlLedger::open_with_clock`]) instead of the database's. Without
//! `LEASEHOLD_TEST_MYSQL_URL` every test prints why it is skipped and passes.
//!
//! The shared `conformance_suite!` macro has no way to skip, so this file lists the
//! suite's tests itself; `this_file_runs_every_test_of_the_shared_suite` fails the
//! moment the shared list and this one differ.

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
    let admin = admin_url()?;
    let db = ScratchDatabase::create(&admin, "lh_test_")
        .await
        .unwrap_or_else(|e| panic!("cannot create a test database at {admin}: {e}"));
    let url = db.url().clone();
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

/// One test per name, on the runtime flavor the shared suite gives it.
macro_rules! mysql_suite {
    (current_thread: $($single:ident),+ $(,)?; multi_thread: $($multi:ident),+ $(,)?) => {
        /// The tests this file runs on a current-thread runtime.
        const CURRENT_THREAD: &[&str] = &[$(stringify!($single)),+];
        /// The tests this file runs on a multi-thread runtime.
        const MULTI_THREAD: &[&str] = &[$(stringify!($multi)),+];
        $(
            #[tokio::test]
            async fn $single() {
                let clock = Arc::new(ManualClock::new(conformance::START));
                if let Some(h) = mysql_ledger(clock).await {
                    conformance::$single(h).await;
                }
            }
        )+
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $multi() {
                let clock = Arc::new(ManualClock::new(conformance::START));
                if let Some(h) = mysql_ledger(clock).await {
                    conformance::$multi(h).await;
                }
            }
        )+
    };
}

mysql_suite!(
    current_thread:
    register_plan_validation_error_names_the_field_and_writes_nothing,
    registering_the_same_content_twice_answers_the_same_plan,
    list_plans_answers_every_plan_oldest_first,
    enqueue_writes_a_queued_attempt_pending_receipts_in_step_order_and_a_pending_command,
    enqueue_guards_refuse_and_write_nothing,
    retry_after_failure_and_compensate_after_success_are_accepted,
    claim_makes_the_command_processing_and_the_attempt_running_and_leaves_nothing_claimable,
    claim_answers_at_most_the_batch,
    heartbeat_renews_the_lease_on_the_ledger_clock,
    step_writes_renew_the_lease_on_the_ledger_clock,
    begin_complete_finish_delivers_with_canonical_evidence_and_its_sha256,
    begin_step_out_of_order_is_refused_and_changes_nothing,
    retried_begin_and_complete_are_idempotent,
    fail_aborts_later_receipts_and_fails_the_attempt_and_command,
    worker_transitions_with_a_stale_token_are_refused_and_change_nothing,
    worker_transitions_on_an_unclaimed_command_are_refused,
    a_live_lease_is_never_taken_over,
    after_expiry_another_owner_takes_over_and_the_old_holder_is_fenced,
    resume_takeover_keeps_succeeded_receipts_and_resets_the_running_one_with_the_same_key,
    replay_takeover_resets_every_receipt_and_drops_evidence,
    reconcile_leaves_a_pending_command_unchanged,
    reconcile_refuses_a_live_lease,
    reconcile_requeues_an_expired_lease_and_fences_its_holder,
    reconcile_leaves_a_terminal_attempt_unchanged,
    abort_fences_the_active_worker,
    abort_of_a_queued_attempt_makes_it_unclaimable,
    abort_of_a_terminal_attempt_is_refused,
    unknown_plan_and_attempt_ids_are_not_found,
    open_attempts_counts_queued_and_running,
    history_is_ordered_by_number,
    retire_plan_makes_enqueue_refuse,
    every_handle_sees_every_committed_write,
    claim_and_begin_begins_each_claimed_attempts_next_step,
    complete_and_continue_delivers_n_steps_in_n_plus_one_transitions,
    fused_writes_with_a_stale_token_are_refused_and_change_nothing;
    multi_thread:
    race_eight_claimers_claim_each_of_1000_commands_exactly_once,
    race_stale_holder_writes_are_refused_while_the_new_holder_proceeds,
);

/// The names listed after `marker` in the shared `conformance_suite!` macro.
fn shared_list(source: &str, marker: &str) -> Vec<String> {
    let at = source
        .find(marker)
        .unwrap_or_else(|| panic!("conformance/mod.rs no longer contains {marker:?}"));
    let list = &source[at + marker.len()..];
    let list = &list[..list.find(')').expect("the list ends with ')'")];
    list.split(',')
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .collect()
}

#[test]
fn this_file_runs_every_test_of_the_shared_suite() {
    let source = include_str!("conformance/mod.rs");
    assert_eq!(
        shared_list(source, "(@current_thread $factory;"),
        CURRENT_THREAD,
        "the shared suite's current-thread tests changed: update mysql_suite! in this file"
    );
    assert_eq!(
        shared_list(source, "(@multi_thread $factory;"),
        MULTI_THREAD,
        "the shared suite's multi-thread tests changed: update mysql_suite! in this file"
    );
}
