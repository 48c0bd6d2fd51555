//! leasehold: a durable, lease-fenced outbox for multi-step deliveries.
//!
//! The rules live in [`leasehold_engine`] (re-exported as [`engine`]); this crate
//! drives them: ledgers ([`ledger`]) store the rows, the tokio [`worker`] delivers
//! claimed commands through [`executor`]s, and the `leasehold` binary is the CLI.

pub use leasehold_engine as engine;

pub mod bench;
pub mod clock;
pub mod entropy;
pub mod executor;
pub mod ledger;
pub mod outbox;
pub mod report;
pub mod serve;
pub mod target;
pub mod text;
pub mod tokens;
pub mod worker;
