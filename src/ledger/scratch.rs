//! What the backends' scratch databases (tests and benchmarks) share.

use super::LedgerError;
use std::future::Future;

/// Runs `drop` (the statement that drops scratch database `name`) to completion on a
/// thread and runtime of its own, so that it works from a `Drop` inside or outside a
/// tokio runtime. A database left behind is harmless: a failure is printed, never a
/// panic in drop.
pub(crate) fn drop_database(name: &str, drop: impl Future<Output = Result<(), LedgerError>> + Send + 'static) {
    let dropped = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
        match runtime {
            Ok(rt) => rt.block_on(drop),
            Err(e) => Err(LedgerError::Internal(format!("no runtime to drop the database: {e}"))),
        }
    })
    .join();
    if let Ok(Err(e)) = dropped {
        eprintln!("warning: could not drop scratch database {name}: {e}");
    }
}
