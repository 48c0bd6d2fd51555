//! Standard output and standard error of the `leasehold` binary, written so that a
//! reader that goes away ends the command quietly.
//!
//! `println!` panics when a write fails, and the common failure is a pipe whose
//! reader has gone (`leasehold plan list --json | head -c 10`). Everything the binary
//! prints goes through `outln!`, `out!` and `errln!` instead:
//!
//! - standard output closed (a broken pipe): the process exits at once, prints
//!   nothing more, with status 141 ([`BROKEN_PIPE_STATUS`]), the status a shell shows
//!   for `cat` or `yes` ended by SIGPIPE: the output is incomplete, so the status is
//!   not success (a `gate` cut short never passes for PASS), and `set -o pipefail`
//!   treats it as it treats every other program;
//! - standard output failing otherwise (a full disk): one line on standard error,
//!   then exit status 1;
//! - standard error failing: the text is dropped and the command goes on to its own
//!   exit status; there is nowhere left to report it.
//!
//! Exiting where the write failed is safe for every command: each ledger write is a
//! transaction that either committed or did not, and a worker that ends mid-delivery
//! leaves its lease to expire and its attempt to be taken over, as after any crash.
//! Log lines of `serve` (tracing, on standard error) drop what they cannot write.

use std::fmt;
use std::io::{self, Write};

/// The exit status when standard output's reader is gone: 128 + SIGPIPE (13).
pub(crate) const BROKEN_PIPE_STATUS: i32 = 141;

/// `println!` on standard output, ending the process quietly if its reader is gone.
macro_rules! outln {
    () => {
        $crate::cli::output::stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::output::stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` on standard output, ending the process quietly if its reader is gone.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::output::stdout(format_args!($($arg)*))
    };
}

/// `eprintln!` on standard error, dropping the line if standard error is gone.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cli::output::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Writes `args` on standard output and flushes it; a failure ends the process
/// ([`BROKEN_PIPE_STATUS`] for a broken pipe, 1 with one line on stderr for any
/// other error).
pub(crate) fn stdout(args: fmt::Arguments<'_>) {
    let written = {
        let mut out = io::stdout().lock();
        out.write_fmt(args).and_then(|()| out.flush())
    };
    if let Err(e) = written {
        stdout_failed(&e);
    }
}

/// Ends the process after standard output failed with `e`.
fn stdout_failed(e: &io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        std::process::exit(BROKEN_PIPE_STATUS);
    }
    stderr(format_args!("error: cannot write to standard output: {e}\n"));
    std::process::exit(1);
}

/// Writes `args` on standard error and flushes it; a failure drops the text.
pub(crate) fn stderr(args: fmt::Arguments<'_>) {
    let mut err = io::stderr().lock();
    let _ = err.write_fmt(args).and_then(|()| err.flush());
}
