//! The `leasehold` command line: register plans, enqueue attempts, run workers, and
//! inspect and repair deliveries. Exit codes: 0 ok, 1 internal error, 2 bad input,
//! 3 refused, 4 gate blocked, 141 the reader of its output went away (as SIGPIPE).

mod cli;

use std::process::ExitCode;

/// mimalloc instead of the system allocator: a transition allocates and frees many
/// small strings (ids, tokens, decoded rows), on the SQLite writer thread among others.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // A sandbox child (`sqlite-sandbox:v1` in its isolated mode) before any flag parsing.
    leasehold::executor::sandbox::child_main_if_requested().unwrap_or_else(cli::main)
}
