//! Fingerprints: a 64-bit digest of a value's `Debug` text.
//!
//! The engine's rows and the driver hold `serde_json::Value`s and lease tokens, so
//! they are not `Hash`; their `Debug` text is hashed instead, as it is written,
//! eight bytes at a time (a multiply-rotate hash: every step is a bijection of the
//! running digest, so two texts written alike that differ in one place never meet).

use std::fmt::{self, Debug, Write as _};

const K: u64 = 0x517c_c1b7_2722_0a95;

struct Digest(u64);

impl Digest {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl fmt::Write for Digest {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut chunks = s.as_bytes().chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap_or_default()));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
        }
        Ok(())
    }
}

/// The digest of `value`'s `Debug` text, chained after `seed`.
pub(super) fn digest(seed: u64, value: &impl Debug) -> u64 {
    let mut d = Digest(seed);
    let _ = write!(d, "{value:?}");
    d.0
}
