//! The simulator's own deterministic random numbers (splitmix64).
//!
//! Contract: every random choice of a run (fault schedule, clock skew, client
//! timing, lost replies) comes from an [`Rng`] derived from the run's seed with a
//! distinct stream label, so adding draws to one stream never shifts another.

/// A splitmix64 generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The stream `label` of the run seeded by `seed`.
    pub fn new(seed: u64, label: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in label.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        let mut r = Rng(seed ^ h);
        r.next_u64();
        r
    }

    /// 64 fresh bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// A signed number in `-max..=max`.
    pub fn signed(&mut self, max: u64) -> i64 {
        let m = i64::try_from(max).unwrap_or(i64::MAX / 2);
        if m == 0 {
            return 0;
        }
        i64::try_from(self.range(0, 2 * max)).unwrap_or(0) - m
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// An index below `n` (`n` > 0).
    pub fn pick(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_repeat_and_differ() {
        let (mut a, mut b, mut c) = (Rng::new(1, "x"), Rng::new(1, "x"), Rng::new(1, "y"));
        let (x, y, z) = (a.next_u64(), b.next_u64(), c.next_u64());
        assert_eq!(x, y);
        assert_ne!(x, z);
        assert!((0..100).all(|_| (3..=5).contains(&a.range(3, 5))));
    }
}
