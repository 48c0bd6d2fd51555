//! The event trace of one run, and its hash.
//!
//! Contract: every host appends lines through a shared [`Trace`], stamped with the
//! simulated time; the order of lines is the order in which the single-threaded
//! simulation produced them, so the same seed gives the same trace, byte for byte.
//! [`trace_hash`] is what a run prints to prove it. No line ever holds a lease token
//! (the checker's invariant 10 scans every one).

use crate::clock::elapsed_ms;
use sha2::{Digest, Sha256};
use std::fmt::Display;
use std::sync::{Arc, Mutex, MutexGuard};

/// A shared, append-only list of trace lines.
#[derive(Debug, Clone, Default)]
pub struct Trace(Arc<Mutex<Vec<String>>>);

impl Trace {
    /// An empty trace.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends a line from `host`, stamped with the current host's simulated time.
    pub fn line(&self, host: &str, text: impl Display) {
        self.line_at(elapsed_ms(), host, text);
    }

    /// Appends a line from `host` stamped with `at_ms`.
    pub fn line_at(&self, at_ms: u64, host: &str, text: impl Display) {
        let line = format!("{:>6}.{:03}s {host:<8} {text}", at_ms / 1000, at_ms % 1000);
        self.lock().push(line);
    }

    /// How many lines so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether there is no line yet.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Takes every line out.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.lock())
    }
}

/// The first 16 hex digits of the SHA-256 of the lines, each ended by a newline.
pub fn trace_hash(lines: &[String]) -> String {
    let mut h = Sha256::new();
    for l in lines {
        h.update(l.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())[..16].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_stamped_and_hashed_in_order() {
        let t = Trace::new();
        t.line_at(1_234, "db", "hello");
        t.line_at(2_000, "w1", "world");
        let lines = t.take();
        assert_eq!(lines[0], "     1.234s db       hello");
        let swapped = vec![lines[1].clone(), lines[0].clone()];
        assert_ne!(trace_hash(&lines), trace_hash(&swapped));
        assert!(t.is_empty());
    }
}
