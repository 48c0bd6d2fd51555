//! Per-host simulated clocks.
//!
//! Contract: turmoil has one global virtual clock; every host reads it through
//! [`turmoil::sim_elapsed`] (so a restarted host keeps counting from the simulation's
//! start) and sees it through its own [`ClockParams`]: a fixed offset, a drift in
//! parts per million, and jumps (forward or backward) at given simulated instants.
//! The epoch is pinned ([`EPOCH_MS`]), never read from the real clock. A clock read
//! outside a host (no current host) answers the reading at elapsed zero.

use leasehold::clock::Clock;
use leasehold_engine::Timestamp;
use std::sync::Mutex;

/// The pinned epoch of every simulation: 2026-01-01T00:00:00Z.
pub const EPOCH_MS: i64 = 1_767_225_600_000;

/// Simulated milliseconds since the simulation started, as the current host sees
/// the global clock.
pub fn elapsed_ms() -> u64 {
    turmoil::sim_elapsed().map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How one host's clock deviates from true simulated time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClockParams {
    /// Added to every reading.
    pub offset_ms: i64,
    /// Parts per million gained (positive) or lost (negative) per elapsed millisecond.
    pub drift_ppm: i64,
    /// `(at elapsed ms, delta ms)`: from `at` on, readings move by `delta`.
    pub jumps: Vec<(u64, i64)>,
}

impl ClockParams {
    /// The reading at `elapsed_ms` of simulated time.
    pub fn reading(&self, elapsed_ms: u64) -> Timestamp {
        let elapsed = i64::try_from(elapsed_ms).unwrap_or(i64::MAX);
        let drift = elapsed.saturating_mul(self.drift_ppm) / 1_000_000;
        let jumped: i64 = self
            .jumps
            .iter()
            .filter(|(at, _)| *at <= elapsed_ms)
            .map(|(_, d)| *d)
            .sum();
        Timestamp::from_millis(EPOCH_MS + self.offset_ms + elapsed + drift + jumped)
    }

    /// Whether this clock reads true time.
    pub fn is_true(&self) -> bool {
        self.offset_ms == 0 && self.drift_ppm == 0 && self.jumps.is_empty()
    }
}

/// One host's clock: the global simulated time seen through [`ClockParams`].
#[derive(Debug, Clone, Default)]
pub struct SimClock {
    params: ClockParams,
}

impl SimClock {
    /// A clock with these deviations.
    pub fn new(params: ClockParams) -> Self {
        Self { params }
    }
}

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        self.params.reading(elapsed_ms())
    }
}

/// The db host's clock: a [`SimClock`] whose reading can be overridden for the
/// duration of one request (the planted bugs that decide at another instant, and a
/// failover's replay of the journal at the instants it was decided at), and shifted
/// for good by each failover to a replica whose clock is off.
#[derive(Debug, Default)]
pub struct DbClock {
    own: SimClock,
    decide_at: Mutex<Option<Timestamp>>,
    /// The promoted replicas' offsets so far, summed.
    shift_ms: Mutex<i64>,
}

impl DbClock {
    /// The db host's clock with these deviations.
    pub fn new(params: ClockParams) -> Self {
        Self {
            own: SimClock::new(params),
            decide_at: Mutex::new(None),
            shift_ms: Mutex::new(0),
        }
    }

    /// The db host's own reading, ignoring any override.
    pub fn own_now(&self) -> Timestamp {
        let shift = *self.shift_ms.lock().unwrap_or_else(|e| e.into_inner());
        Timestamp::from_millis(self.own.now().as_millis() + shift)
    }

    /// From now on the clock reads `delta_ms` more (a promoted replica's clock).
    pub fn shift(&self, delta_ms: i64) {
        *self.shift_ms.lock().unwrap_or_else(|e| e.into_inner()) += delta_ms;
    }

    /// Makes [`Clock::now`] answer `at` until [`DbClock::clear`].
    pub fn decide_at(&self, at: Timestamp) {
        *self.decide_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
    }

    /// Removes the override.
    pub fn clear(&self) {
        *self.decide_at.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl Clock for DbClock {
    fn now(&self) -> Timestamp {
        let decided = *self.decide_at.lock().unwrap_or_else(|e| e.into_inner());
        decided.unwrap_or_else(|| self.own_now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_drift_and_jumps_add_up() {
        let p = ClockParams {
            offset_ms: 500,
            drift_ppm: 100_000,
            jumps: vec![(1_000, -300), (5_000, 2_000)],
        };
        assert_eq!(p.reading(0).as_millis(), EPOCH_MS + 500);
        assert_eq!(p.reading(2_000).as_millis(), EPOCH_MS + 500 + 2_000 + 200 - 300);
        assert_eq!(
            p.reading(10_000).as_millis(),
            EPOCH_MS + 500 + 10_000 + 1_000 - 300 + 2_000
        );
    }

    #[test]
    fn db_clock_override_is_temporary() {
        let c = DbClock::new(ClockParams::default());
        c.decide_at(Timestamp::from_millis(42));
        assert_eq!(c.now(), Timestamp::from_millis(42));
        c.clear();
        assert_eq!(c.now().as_millis(), EPOCH_MS);
        c.shift(-1_500);
        c.shift(400);
        assert_eq!(c.now().as_millis(), EPOCH_MS - 1_100);
        assert_eq!(c.own_now().as_millis(), EPOCH_MS - 1_100);
    }
}
