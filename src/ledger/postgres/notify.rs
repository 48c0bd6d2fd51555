//! Wake-ups: `LISTEN`/`NOTIFY` on one channel, so that an idle worker claims new work
//! at once instead of at its next poll.
//!
//! Contract: every transaction that makes work claimable (an enqueue; a reconcile that
//! puts a command back to PENDING) sends `NOTIFY` on [`CHANNEL`] inside itself, so the
//! notification is delivered when, and only if, it commits. Polling stays the
//! fallback: a notification can be lost (the listening session broke and is being
//! replaced), and work also becomes claimable by time alone (a lease expires, a
//! backoff ends), which nothing notifies.

use super::error::TxError;
use super::{tls, PostgresUrl, Ssl};
use crate::ledger::sql::session::Session;
use std::time::Duration;
use tokio::sync::watch;
use tokio_postgres::AsyncMessage;

/// The channel every enqueue notifies and every listener listens on.
pub const CHANNEL: &str = "leasehold_work";

/// Notifies [`CHANNEL`] when the caller's transaction commits.
pub(super) async fn send<S: Session>(s: &mut S) -> Result<(), TxError> {
    s.execute("SELECT pg_notify('leasehold_work', '')", &[]).await?;
    Ok(())
}

/// How long the listener waits before it connects again after losing its session.
const RECONNECT_MIN_MS: u64 = 100;
const RECONNECT_MAX_MS: u64 = 5_000;

/// Starts the listener of one ledger: a task holding a dedicated session (not a pooled
/// one) that `LISTEN`s on [`CHANNEL`] and bumps the answered counter on every
/// notification, and once as soon as it listens (what was enqueued before, or while a
/// broken session was being replaced, was not announced: receivers look once). When
/// its session ends it waits, longer after each failed attempt, and connects again. It
/// stops when every receiver is gone. Must be called inside a tokio runtime.
pub(super) fn listen(url: &PostgresUrl) -> watch::Receiver<u64> {
    let (tx, rx) = watch::channel(0u64);
    let url = url.clone();
    tokio::spawn(async move {
        let mut wait_ms = RECONNECT_MIN_MS;
        loop {
            tokio::select! {
                () = tx.closed() => return,
                listened = session(&url, &tx) => {
                    if listened {
                        wait_ms = RECONNECT_MIN_MS;
                    }
                }
            }
            tokio::select! {
                () = tx.closed() => return,
                () = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
            }
            wait_ms = (wait_ms * 2).min(RECONNECT_MAX_MS);
        }
    });
    rx
}

/// One listening session, until it ends; answers whether it got as far as `LISTEN`.
async fn session(url: &PostgresUrl, tx: &watch::Sender<u64>) -> bool {
    let Ok(tls) = tls::connector(url.options.ssl == Ssl::VerifyFull) else {
        return false;
    };
    let Ok(Ok((client, mut connection))) =
        tokio::time::timeout(url.options.connect_timeout(), url.config().connect(tls)).await
    else {
        return false;
    };
    let (listening_tx, mut listening_rx) = tokio::sync::oneshot::channel::<bool>();
    let listen = async move {
        let ok = client.batch_execute(&format!("LISTEN {CHANNEL}")).await.is_ok();
        if ok {
            // Listening from now on; what was enqueued before is not announced, so
            // receivers look once.
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
        let _ = listening_tx.send(ok);
        // The client lives in this future, which never ends: dropping the client
        // would end the session.
        std::future::pending::<()>().await;
    };
    let messages = async {
        let mut listening = false;
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(_))) => tx.send_modify(|n| *n = n.wrapping_add(1)),
                Some(Ok(_)) => {}
                // The session broke or ended.
                Some(Err(_)) | None => return listening || matches!(listening_rx.try_recv(), Ok(true)),
            }
            if !listening {
                listening = matches!(listening_rx.try_recv(), Ok(true));
            }
        }
    };
    tokio::select! {
        () = listen => false,
        listened = messages => listened,
    }
}
