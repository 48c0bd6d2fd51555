//! The `leasehold` command line: register plans, enqueue attempts, run workers, and
//! inspect and repair deliveries. Exit codes: 0 ok, 1 internal error, 2 bad input,
//! 3 refused.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
