//! What tests can make the MySQL ledger do at chosen points: kill its own
//! connection, stall while holding locks, pause a claim (tests only).

use super::error::{DbResult, TxError};
use super::session::MyClient;
use super::MyBackend;
use crate::ledger::sql::ledger::Checkpoint;
use std::sync::Mutex;
use std::time::Duration;

/// A test's pause point: a sender that says the claim got there, and a receiver that
/// lets it go on.
pub(super) type Pause = (tokio::sync::oneshot::Sender<()>, tokio::sync::oneshot::Receiver<()>);

/// The armed hooks of one ledger (and its clones).
#[derive(Debug, Default)]
pub(super) struct Hooks {
    /// Kill the next worker transition's connection at this point.
    pub(super) kill: Mutex<Option<Checkpoint>>,
    /// Stall the next worker transition this long after its locking reads.
    pub(super) stall: Mutex<Option<Duration>>,
    /// Pause the next claim once it has fixed what it sees and before it locks
    /// anything.
    pub(super) pause: Mutex<Option<Pause>>,
    /// Pause the next `SKIP LOCKED` claim while it holds the rows it locked.
    pub(super) pause_holding: Mutex<Option<Pause>>,
}

/// Signals the test and waits for its go-ahead, if it armed `slot`.
pub(super) async fn pause_at(slot: &Mutex<Option<Pause>>) {
    let pause = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some((reached, resume)) = pause {
        let _ = reached.send(());
        let _ = resume.await;
    }
}

/// Arms `slot`: answers a receiver that fires when the claim got there and a sender
/// that lets it go on.
pub(super) fn arm(
    slot: &Mutex<Option<Pause>>,
) -> (tokio::sync::oneshot::Receiver<()>, tokio::sync::oneshot::Sender<()>) {
    let (reached_tx, reached_rx) = tokio::sync::oneshot::channel();
    let (resume_tx, resume_rx) = tokio::sync::oneshot::channel();
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((reached_tx, resume_rx));
    (reached_rx, resume_tx)
}

/// A worker transaction reached `point`: kills its connection from another one, and
/// stalls it after its reads, if a test asked for that.
pub(super) async fn checkpoint(backend: &MyBackend, tx: &impl MyClient, point: Checkpoint) -> Result<(), TxError> {
    let armed = {
        let mut kill = backend.hooks.kill.lock().unwrap_or_else(|e| e.into_inner());
        kill.take_if(|p| *p == point).is_some()
    };
    if armed {
        use mysql_async::prelude::Queryable;
        let mut other = backend.connect().await?;
        other
            .query_drop(format!("KILL CONNECTION {}", tx.connection_id()))
            .await
            .db()?;
    }
    if point == Checkpoint::AfterReads {
        let stall = backend.hooks.stall.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(stall) = stall {
            tokio::time::sleep(stall).await;
        }
    }
    Ok(())
}

/// Whether a test asked the next claim to pause before it locks anything.
pub(super) fn pause_armed(backend: &MyBackend) -> bool {
    backend.hooks.pause.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}
