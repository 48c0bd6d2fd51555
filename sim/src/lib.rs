//! leasehold-sim: deterministic simulations of leasehold's production worker.
//!
//! A seed builds a world on turmoil ([`world`]): a db host serving the memory or
//! the SQLite ledger over a small TCP protocol ([`db`], [`protocol`]), worker hosts
//! running the production [`leasehold::worker::Worker`] with an RPC ledger client
//! ([`rpc`]), a skewed clock ([`clock`]) and an executor that calls an idempotent
//! target host ([`target`]), plus an enqueuer and an operator ([`clients`]). Faults
//! from the seed's profile ([`profile`]) hit it during a safety phase; then it is
//! healed and must converge; a profile may fail the db host over to a replica, sync
//! or async, whose clock is off ([`db::DbState::fail_over`]). The [`checker`] proves
//! twenty-six invariants on every run from
//! what the hosts recorded (the model-based history check is [`history`], the delivery
//! policy's invariants are [`delivery`], routing's is [`routing`], the per-target
//! limits' are [`limits`], trace context's is [`traces`], enqueue keys' is [`keys`],
//! order keys' is [`ordered`], durability's is [`durability`]); planted
//! bugs ([`bugs`]) prove that it can fail; the run prints a hash of its event [`trace`], and the
//! same seed always gives the same hash. [`runner`] runs many seeds on every core.
//! [`model`] explores every interleaving of small configurations with the engine's
//! own rules and driver, checking the same invariants in every reachable state.
//!
//! Determinism rules, enforced by `sim/clippy.toml` where a lint can: turmoil's RNG
//! seeded and its epoch pinned; `biased;` in every `select!`; ordered maps only; ids
//! and tokens from the seed; no `std::time` or OS randomness on a simulated path.

pub mod bugs;
pub mod checker;
pub mod clients;
pub mod clock;
pub mod db;
pub mod delivery;
pub mod durability;
pub mod history;
pub mod keys;
pub mod limits;
pub mod model;
pub mod ordered;
pub mod plans;
pub mod profile;
pub mod protocol;
pub mod rng;
pub mod routing;
pub mod rpc;
pub mod runner;
pub mod target;
pub mod trace;
pub mod traces;
pub mod world;
