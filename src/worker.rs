//! Worker (in progress).
