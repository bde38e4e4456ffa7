//! Wakes idle workers when the insert trigger notifies.
//!
//! The listener only bumps a generation counter in a `watch` channel; a worker notes the
//! generation before it claims and, once idle, returns at once if it moved meanwhile. So a
//! notification that arrives while every worker is busy is never lost.

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;

/// Listens on `channel` until `shutdown`, bumping `wake` on every notification and after every
/// reconnect (notifications sent while disconnected are lost, so workers should look).
pub(crate) async fn listen(
    pool: PgPool,
    channel: String,
    wake: watch::Sender<u64>,
    shutdown: CancellationToken,
) {
    let bump = || wake.send_modify(|g| *g = g.wrapping_add(1));
    let mut backoff = Backoff::transient();
    while !shutdown.is_cancelled() {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "notification listener cannot connect");
                pause(&shutdown, &mut backoff).await;
                continue;
            }
        };
        if let Err(e) = listener.listen(&channel).await {
            tracing::debug!(error = %e, channel, "LISTEN failed");
            pause(&shutdown, &mut backoff).await;
            continue;
        }
        backoff.reset();
        bump();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                n = listener.try_recv() => match n {
                    Ok(Some(_)) => bump(),
                    // Connection lost: try_recv reconnects on the next call.
                    Ok(None) => bump(),
                    Err(e) => {
                        tracing::debug!(error = %e, "notification listener failed");
                        bump();
                        pause(&shutdown, &mut backoff).await;
                        break;
                    }
                },
            }
        }
    }
}

async fn pause(shutdown: &CancellationToken, backoff: &mut Backoff) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(backoff.next_delay()) => {}
    }
}
