//! Fingerprints: a 64-bit digest of a value's `Debug` text.
//!
//! The engine's rows and the driver hold `serde_json::Value`s and lease tokens, so
//! they are not `Hash`; their `Debug` text is hashed instead, as it is written,
//! eight bytes at a time (a multiply-rotate hash: every step is a bijection of the
//! running digest, so two texts written alike that differ in one place never meet).

use std::fmt::{self, Debug, Write as _};
use std::ops::{Deref, DerefMut};
use std::rc::Rc;

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

/// A part of the state that most transitions leave as it is: the states that have
/// not changed it share one copy (cloning a state clones a pointer), and its digest
/// is computed once, when it is made or changed. Its `Debug` text is that digest, so
/// a state's fingerprint reads the digest and not the rows again.
#[derive(Clone)]
pub(super) struct Shared<T>(Rc<(T, u64)>);

impl<T: Debug + Clone> Shared<T> {
    /// `value`, with its digest.
    pub fn new(value: T) -> Self {
        let d = digest(0, &value);
        Self(Rc::new((value, d)))
    }

    /// Changes the value (copying it first if another state shares it) and
    /// computes its digest again; answers what `change` answers.
    pub fn update<R>(&mut self, change: impl FnOnce(&mut T) -> R) -> R {
        change(&mut self.get_mut())
    }

    /// The digest of the value's `Debug` text.
    pub fn digest(&self) -> u64 {
        self.0 .1
    }

    /// The value to change (copied first if another state shares it); its digest
    /// is computed again when the answer is dropped.
    pub fn get_mut(&mut self) -> Changing<'_, T> {
        Changing(Rc::make_mut(&mut self.0))
    }
}

/// A [`Shared`] value being changed: its digest is computed again when this is
/// dropped.
pub(super) struct Changing<'a, T: Debug>(&'a mut (T, u64));

impl<T: Debug> Deref for Changing<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0 .0
    }
}

impl<T: Debug> DerefMut for Changing<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0 .0
    }
}

impl<T: Debug> Drop for Changing<'_, T> {
    fn drop(&mut self) {
        self.0 .1 = digest(0, &self.0 .0);
    }
}

impl<T> Deref for Shared<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0 .0
    }
}

impl<T> Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{:016x}", self.0 .1)
    }
}
