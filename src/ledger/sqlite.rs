//! SQLite ledger (in progress).
