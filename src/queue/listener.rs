//! The chain queue's listener: LISTENs on apalis' insert channel with a connection of its
//! own and rings the [`Fetcher`] for every job of the chain queue announced there, and once
//! each time it has subscribed, first or again. NOTIFY is not queued for a session that is
//! not listening: a job committed before the subscription, or while the connection was
//! lost, is found by the fetch that ring starts, not left to the safety-net poll.

use std::{sync::Arc, time::Duration};

use serde::Deserialize;
use sqlx::{PgPool, postgres::PgListener};
use tokio_util::sync::CancellationToken;

use super::fetcher::Fetcher;
use super::table::{CHAIN_QUEUE, INSERT_CHANNEL};

/// The first pause before subscribing again after a failure; doubles up to
/// [`RESUBSCRIBE_MAX`].
const RESUBSCRIBE_MIN: Duration = Duration::from_millis(100);
/// The longest pause between attempts to subscribe again.
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(2);

/// The part of apalis' insert announcement that names the queue.
#[derive(Deserialize)]
struct Announcement {
    job_type: String,
}

/// Listens until `shutdown`, subscribing again whenever the connection is lost; a failed
/// subscription is logged once per outage and tried again, backing off to
/// [`RESUBSCRIBE_MAX`].
///
/// Each subscription names its session after the process (`worker`, as
/// `application_name`) and records the role in the process's `workers` row, so that the
/// [rescuer](crate::maintenance::rescuer) of another process sees a killed one's session
/// gone at once.
pub async fn listen(
    pool: PgPool,
    worker: String,
    fetcher: Arc<Fetcher>,
    shutdown: CancellationToken,
) {
    let mut pause = RESUBSCRIBE_MIN;
    let mut failing = false;
    loop {
        let subscribed = tokio::select! {
            _ = shutdown.cancelled() => return,
            subscribed = async {
                fetcher.may_subscribe().await;
                subscribe(&pool, &worker).await
            } => subscribed,
        };
        let mut listener = match subscribed {
            Ok(listener) => listener,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "queue listener cannot subscribe; trying again");
                    failing = true;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(RESUBSCRIBE_MAX);
                continue;
            }
        };
        if failing {
            tracing::info!("queue listener subscribed again");
        }
        pause = RESUBSCRIBE_MIN;
        fetcher.subscribed();
        loop {
            let received = tokio::select! {
                _ = shutdown.cancelled() => return,
                received = listener.try_recv() => received,
            };
            match received {
                Ok(Some(notification)) => {
                    let ours = |payload: &str| {
                        serde_json::from_str::<Announcement>(payload)
                            .map_or(true, |a| a.job_type == CHAIN_QUEUE)
                    };
                    // A burst of announcements is one ring.
                    let mut ring = ours(notification.payload());
                    while let Some(n) = listener.next_buffered() {
                        ring |= ours(n.payload());
                    }
                    if ring {
                        fetcher.ring();
                    }
                }
                Ok(None) => {
                    tracing::warn!("queue listener lost its connection; subscribing again");
                    failing = true;
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "queue listener failed; subscribing again");
                    failing = true;
                    break;
                }
            }
        }
    }
}

/// A listener on apalis' insert channel, on a connection of its own. It does not reconnect
/// by itself: [`listen`] does, through the same path as the first subscription.
async fn subscribe(pool: &PgPool, worker: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.eager_reconnect(false);
    // PostgreSQL cuts application_name at 63 bytes: a longer name could never be found,
    // so such a process is judged by its beat alone.
    if worker.len() <= 63 {
        sqlx::query("SELECT set_config('application_name', $1, false)")
            .bind(worker)
            .execute(&mut listener)
            .await?;
        crate::workers::note_session_role(pool, worker).await?;
    }
    listener.listen(INSERT_CHANNEL).await?;
    Ok(listener)
}
