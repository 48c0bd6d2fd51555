//! How many deliveries the receiver processes at once: an in-flight count and its
//! maximum since the target started, in total and per request path (not stored).
//!
//! A delivery enters when its handler starts and leaves when its answer is ready
//! ([`InFlight`] is dropped). The counts are atomics; the maximum follows them with
//! `fetch_max`, so it is exact: the most deliveries that were in flight at one
//! moment.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The most request paths whose concurrency is tracked one by one
/// ([`super::Effects::max_concurrent_by_path`]); deliveries to further paths count in
/// the total only.
pub const MAX_TRACKED_PATHS: usize = 1_024;

/// A count of deliveries in flight and the most there were at once.
#[derive(Debug, Default)]
struct Gauge {
    in_flight: AtomicU64,
    max: AtomicU64,
}

impl Gauge {
    fn enter(&self) {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    fn max(&self) -> u64 {
        self.max.load(Ordering::SeqCst)
    }
}

/// The deliveries in flight, in total and for the first `max_paths` paths met.
#[derive(Debug)]
pub(super) struct Concurrency {
    total: Arc<Gauge>,
    by_path: Mutex<HashMap<String, Arc<Gauge>>>,
    max_paths: usize,
}

impl Default for Concurrency {
    fn default() -> Self {
        Self::tracking(MAX_TRACKED_PATHS)
    }
}

/// A delivery in flight: it leaves its gauges when dropped (its answer is ready, or
/// its work ended after the client hung up).
#[derive(Debug)]
#[must_use = "the delivery leaves its gauges when this is dropped"]
pub(super) struct InFlight {
    total: Arc<Gauge>,
    path: Option<Arc<Gauge>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.total.leave();
        if let Some(path) = &self.path {
            path.leave();
        }
    }
}

impl Concurrency {
    /// Gauges that track at most `max_paths` paths one by one.
    fn tracking(max_paths: usize) -> Self {
        Self {
            total: Arc::default(),
            by_path: Mutex::default(),
            max_paths,
        }
    }

    /// A delivery to `path` starts.
    pub(super) fn enter(&self, path: &str) -> InFlight {
        let path = {
            let mut by_path = self.by_path.lock().unwrap_or_else(|e| e.into_inner());
            match by_path.get(path) {
                Some(gauge) => Some(Arc::clone(gauge)),
                None if by_path.len() < self.max_paths => Some(Arc::clone(by_path.entry(path.to_owned()).or_default())),
                None => None,
            }
        };
        self.total.enter();
        if let Some(gauge) = &path {
            gauge.enter();
        }
        InFlight {
            total: Arc::clone(&self.total),
            path,
        }
    }

    /// The most deliveries in flight at once since the start.
    pub(super) fn max(&self) -> u64 {
        self.total.max()
    }

    /// The same, per tracked path.
    pub(super) fn max_by_path(&self) -> BTreeMap<String, u64> {
        let by_path = self.by_path.lock().unwrap_or_else(|e| e.into_inner());
        by_path
            .iter()
            .map(|(path, gauge)| (path.clone(), gauge.max()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maximum_is_the_most_in_flight_at_once_and_stays_after_they_leave() {
        let gauges = Concurrency::default();
        let first = [gauges.enter("/a"), gauges.enter("/a"), gauges.enter("/b")];
        assert_eq!(gauges.max(), 3);
        drop(first);
        let second = [gauges.enter("/b"), gauges.enter("/b")];
        assert_eq!(gauges.max(), 3, "two at once never beat three");
        assert_eq!(gauges.max_by_path(), [("/a".into(), 2), ("/b".into(), 2)].into());
        drop(second);
        assert_eq!(gauges.total.in_flight.load(Ordering::SeqCst), 0);
        assert_eq!(gauges.max(), 3);
    }

    #[test]
    fn paths_beyond_the_cap_count_in_the_total_only() {
        let gauges = Concurrency::tracking(2);
        let held = ["/a", "/b", "/c", "/c", "/a"].map(|p| gauges.enter(p));
        assert_eq!(gauges.max(), 5);
        assert_eq!(gauges.max_by_path(), [("/a".into(), 2), ("/b".into(), 1)].into());
        drop(held);
        let _later = gauges.enter("/c");
        assert!(
            !gauges.max_by_path().contains_key("/c"),
            "the cap holds after they leave"
        );
    }
}
