//! Lease math and the worker configuration clamp.
//!
//! Configuration is clamped to positive bounds, never rejected for being out of
//! range: a zero lease becomes the minimum lease, a huge batch the maximum batch.

/// Shortest lease a worker may hold.
pub const LEASE_MS_MIN: u64 = 100;
/// Longest lease a worker may hold (one day).
pub const LEASE_MS_MAX: u64 = 86_400_000;
/// Shortest poll interval.
pub const POLL_INTERVAL_MS_MIN: u64 = 10;
/// Longest poll interval (one hour).
pub const POLL_INTERVAL_MS_MAX: u64 = 3_600_000;
/// Smallest claim batch.
pub const BATCH_SIZE_MIN: u32 = 1;
/// Largest claim batch.
pub const BATCH_SIZE_MAX: u32 = 256;
/// The default cap on one step's evidence and target receipt, in bytes of canonical
/// JSON (256 KiB), for every executor.
pub const MAX_EVIDENCE_BYTES: usize = 256 * 1024;
/// Smallest evidence cap a worker may be given.
pub const EVIDENCE_BYTES_MIN: usize = 1024;
/// Largest evidence cap a worker may be given (16 MiB).
pub const EVIDENCE_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Worker configuration after clamping. Build it with [`WorkerConfig::clamped`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Whether the worker polls for new commands at all.
    pub polling: bool,
    /// Time between polls when there was nothing to claim.
    pub poll_interval_ms: u64,
    /// Commands claimed per poll.
    pub batch_size: u32,
    /// Lease length granted on claim and each renewal.
    pub lease_ms: u64,
    /// The most bytes one step's evidence and target receipt may take together
    /// (canonical JSON); a step over it fails permanently. Default
    /// [`MAX_EVIDENCE_BYTES`]; set it with [`WorkerConfig::with_max_evidence_bytes`].
    pub max_evidence_bytes: usize,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            polling: true,
            poll_interval_ms: 5_000,
            batch_size: 5,
            lease_ms: 60_000,
            max_evidence_bytes: MAX_EVIDENCE_BYTES,
        }
    }
}

impl WorkerConfig {
    /// A configuration with every value clamped into its bounds.
    pub fn clamped(polling: bool, poll_interval_ms: u64, batch_size: u32, lease_ms: u64) -> Self {
        Self {
            polling,
            poll_interval_ms: poll_interval_ms.clamp(POLL_INTERVAL_MS_MIN, POLL_INTERVAL_MS_MAX),
            batch_size: batch_size.clamp(BATCH_SIZE_MIN, BATCH_SIZE_MAX),
            lease_ms: lease_ms.clamp(LEASE_MS_MIN, LEASE_MS_MAX),
            max_evidence_bytes: MAX_EVIDENCE_BYTES,
        }
    }

    /// The same configuration with its evidence cap set to `bytes`, clamped to
    /// [`EVIDENCE_BYTES_MIN`]..=[`EVIDENCE_BYTES_MAX`].
    #[must_use]
    pub fn with_max_evidence_bytes(mut self, bytes: usize) -> Self {
        self.max_evidence_bytes = bytes.clamp(EVIDENCE_BYTES_MIN, EVIDENCE_BYTES_MAX);
        self
    }

    /// Heartbeat period: a third of the lease, so two heartbeats can be lost before
    /// the lease expires.
    pub fn heartbeat_ms(&self) -> u64 {
        heartbeat_ms(self.lease_ms)
    }
}

/// A third of the lease, at least one millisecond.
pub fn heartbeat_ms(lease_ms: u64) -> u64 {
    (lease_ms / 3).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_are_clamped_not_rejected() {
        let c = WorkerConfig::clamped(true, 0, 0, 0);
        assert_eq!(
            (c.poll_interval_ms, c.batch_size, c.lease_ms),
            (POLL_INTERVAL_MS_MIN, 1, LEASE_MS_MIN)
        );
        let c = WorkerConfig::clamped(true, u64::MAX, u32::MAX, u64::MAX);
        assert_eq!(
            (c.poll_interval_ms, c.batch_size, c.lease_ms),
            (POLL_INTERVAL_MS_MAX, BATCH_SIZE_MAX, LEASE_MS_MAX)
        );
        assert_eq!(c.with_max_evidence_bytes(0).max_evidence_bytes, EVIDENCE_BYTES_MIN);
        assert_eq!(
            c.with_max_evidence_bytes(usize::MAX).max_evidence_bytes,
            EVIDENCE_BYTES_MAX
        );
        assert_eq!(c.with_max_evidence_bytes(5_000).max_evidence_bytes, 5_000);
    }

    #[test]
    fn defaults_follow_the_design() {
        let c = WorkerConfig::default();
        assert_eq!(
            (c.polling, c.poll_interval_ms, c.batch_size, c.lease_ms),
            (true, 5_000, 5, 60_000)
        );
        assert_eq!(c.heartbeat_ms(), 20_000);
        assert_eq!(c.max_evidence_bytes, 256 * 1024);
        assert_eq!(
            WorkerConfig::clamped(true, 1, 1, 1).max_evidence_bytes,
            MAX_EVIDENCE_BYTES
        );
    }
}
