//! Rate-limit blocks (table `connection_blocks`, owned here): a 429 blocks its whole budget
//! (every connection sharing the budget key) for the wait it asked for, capped at one day,
//! or 60 s when it named none. A later 429 may extend a block, never shorten it.
//!
//! Every process keeps [`Blocks`], an in-memory copy of the table that the throttle layer
//! reads before each job: loaded when its listener subscribes, and refreshed whenever a
//! block is written (a trigger sends `NOTIFY courier_blocks, '<budget key>'`). A block
//! the process heard a 429 set holds there from that moment, before its job writes it.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
    time::Duration,
};

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool, postgres::PgListener};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::limits::{DEFAULT_RATE_LIMIT_WAIT, MAX_RATE_LIMIT_WAIT, MIN_RATE_LIMIT_WAIT};

/// The channel a written block is announced on (payload: the budget key).
pub const BLOCKS_CHANNEL: &str = "courier_blocks";

/// The block a rate-limit response sets, from the wait it named: 60 s when it named none,
/// at most one day, at least [`MIN_RATE_LIMIT_WAIT`]. A target answering `retry-after: 0`
/// (or a date already past) still gets a second's rest: a 429 says "not now", whatever
/// wait it names.
pub fn block_length(wait: Option<Duration>) -> Duration {
    wait.unwrap_or(DEFAULT_RATE_LIMIT_WAIT)
        .clamp(MIN_RATE_LIMIT_WAIT, MAX_RATE_LIMIT_WAIT)
}

/// Where a 429 came from.
#[derive(Clone, Copy, Debug)]
pub struct Cause<'a> {
    /// The budget (and so the connections) the block holds back.
    pub budget_key: &'a str,
    /// The connection whose call met the 429.
    pub connection_id: i64,
    /// The rule whose call met it (`None`: a call of no rule, an erasure's).
    pub rule_id: Option<i64>,
    /// The run whose call met it (`None`: a call of no run).
    pub run_id: Option<i64>,
}

/// Blocks a budget until `until` (set at `now`), unless it is already blocked for longer
/// (a block is extended, never shortened); returns the block's end as it now stands.
pub async fn block(
    db: impl PgExecutor<'_>,
    cause: &Cause<'_>,
    until: DateTime<Utc>,
    raw: Option<&str>,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, sqlx::Error> {
    let set = Set {
        budget_key: cause.budget_key,
        connection_id: cause.connection_id,
        rule_id: cause.rule_id,
        run_id: cause.run_id,
        raw,
    };
    write(db, &set, until, now).await
}

/// Blocks budget `key` by hand until `until` (set at `now`), on connection
/// `connection_id`'s behalf with the wait `raw` a 429 would name, but met by no rule's
/// call: a block a tool sets up (the idle-throttled benchmark's backlog behind one).
/// Extended, never shortened, as [`block`]; returns the block's end as it now stands.
pub async fn block_by_hand(
    db: impl PgExecutor<'_>,
    key: &str,
    connection_id: i64,
    until: DateTime<Utc>,
    raw: Option<&str>,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, sqlx::Error> {
    let set = Set {
        budget_key: key,
        connection_id,
        rule_id: None,
        run_id: None,
        raw,
    };
    write(db, &set, until, now).await
}

/// Who sets a block, as its row names them.
struct Set<'a> {
    budget_key: &'a str,
    connection_id: i64,
    rule_id: Option<i64>,
    run_id: Option<i64>,
    raw: Option<&'a str>,
}

/// Writes block `set` until `until` (at `now`), keeping a longer one in force.
async fn write(
    db: impl PgExecutor<'_>,
    set: &Set<'_>,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar!(
        "INSERT INTO connection_blocks
            (budget_key, connection_id, blocked_until, rule_id, run_id, retry_after_raw, set_at)
         VALUES ($7, $1, $2, $3, $4, $5, $6)
         ON CONFLICT (budget_key) DO UPDATE SET
            connection_id = CASE WHEN EXCLUDED.blocked_until > connection_blocks.blocked_until
                                 THEN EXCLUDED.connection_id ELSE connection_blocks.connection_id END,
            blocked_until = GREATEST(connection_blocks.blocked_until, EXCLUDED.blocked_until),
            rule_id = CASE WHEN EXCLUDED.blocked_until > connection_blocks.blocked_until
                           THEN EXCLUDED.rule_id ELSE connection_blocks.rule_id END,
            run_id = CASE WHEN EXCLUDED.blocked_until > connection_blocks.blocked_until
                          THEN EXCLUDED.run_id ELSE connection_blocks.run_id END,
            retry_after_raw = CASE WHEN EXCLUDED.blocked_until > connection_blocks.blocked_until
                                   THEN EXCLUDED.retry_after_raw ELSE connection_blocks.retry_after_raw END,
            set_at = CASE WHEN EXCLUDED.blocked_until > connection_blocks.blocked_until
                          THEN EXCLUDED.set_at ELSE connection_blocks.set_at END
         RETURNING courier_ts(blocked_until) AS \"blocked_until!\"",
        set.connection_id,
        until,
        set.rule_id,
        set.run_id,
        set.raw,
        now,
        set.budget_key
    )
    .fetch_one(db)
    .await
}

/// Lifts the block on budget `key` (an operator's decision); returns how many were lifted
/// (0 or 1). The trigger tells every process's copy.
pub async fn lift(db: impl PgExecutor<'_>, key: &str) -> Result<u64, sqlx::Error> {
    Ok(
        sqlx::query!("DELETE FROM connection_blocks WHERE budget_key = $1", key)
            .execute(db)
            .await?
            .rows_affected(),
    )
}

/// The blocks every budget is under, as this process knows them.
#[derive(Debug, Default)]
pub struct Blocks {
    /// Block end per budget key (lapsed ones may linger; they decide nothing).
    until: RwLock<HashMap<String, DateTime<Utc>>>,
    /// Set once the listener is subscribed and the table loaded.
    listening: OnceCell<()>,
    /// Blocks this process met and logged, until it logs their end (the copy above is
    /// refreshed by NOTIFY, possibly before the process that wrote a block looks).
    announced: std::sync::Mutex<HashMap<String, DateTime<Utc>>>,
    /// Blocks this process heard a 429 set and its job has not yet written: a refresh
    /// from the table in between keeps them (an unwritten block is not a lifted one).
    /// Locked before `until` when both are.
    heard: std::sync::Mutex<HashMap<String, DateTime<Utc>>>,
}

impl Blocks {
    /// When the block on budget `key` ends, if it has one.
    pub fn until(&self, key: &str) -> Option<DateTime<Utc>> {
        self.until.read().expect("blocks lock").get(key).copied()
    }

    /// Notes a block this process's call met: true when it is a new one (none was
    /// announced here, or the last one lapsed by `now`), the moment to log it.
    pub fn announce(&self, key: &str, until: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        let mut map = self.announced.lock().expect("announced lock");
        let new = map.get(key).is_none_or(|&t| t <= now);
        let end = map.entry(key.to_owned()).or_insert(until);
        *end = if new { until } else { (*end).max(until) };
        new
    }

    /// Forgets the block announced on `key`, returning its end: called when a job finds
    /// no block in force (it lapsed, or was lifted), the moment to log that it is over.
    pub fn take_announced(&self, key: &str) -> Option<DateTime<Utc>> {
        self.announced.lock().expect("announced lock").remove(key)
    }

    /// Records a block a 429 this process heard sets, from that moment; its job writes it
    /// to the table ([`Blocks::written`]) a little later.
    pub fn heard(&self, key: &str, until: DateTime<Utc>) {
        let mut heard = self.heard.lock().expect("heard lock");
        let end = heard.entry(key.to_owned()).or_insert(until);
        *end = (*end).max(until);
        self.extend(key, until);
    }

    /// Records a block this process wrote to the table (others hear of it by NOTIFY): from
    /// now on the table's copy speaks for it, an operator's lift included.
    pub fn written(&self, key: &str, until: DateTime<Utc>) {
        let mut heard = self.heard.lock().expect("heard lock");
        if heard.get(key).is_some_and(|&h| h <= until) {
            heard.remove(key);
        }
        self.extend(key, until);
    }

    fn extend(&self, key: &str, until: DateTime<Utc>) {
        let mut map = self.until.write().expect("blocks lock");
        let end = map.entry(key.to_owned()).or_insert(until);
        *end = (*end).max(until);
    }

    /// Starts the listener that keeps this copy current, once per process: subscribes,
    /// then loads the table, so no block written meanwhile is missed. It stops with
    /// `shutdown` or when the pool is closed.
    pub async fn ensure_listening(
        self: &Arc<Self>,
        pool: &PgPool,
        shutdown: &CancellationToken,
    ) -> Result<(), sqlx::Error> {
        self.listening
            .get_or_try_init(|| async {
                let mut listener = PgListener::connect_with(pool).await?;
                listener.listen(BLOCKS_CHANNEL).await?;
                self.reload(pool).await?;
                let blocks = Arc::downgrade(self);
                let pool = pool.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    // Said once per outage, not once a second while it lasts.
                    let mut failing = false;
                    loop {
                        let received = tokio::select! {
                            r = listener.recv() => r,
                            _ = shutdown.cancelled() => return,
                            _ = pool.close_event() => return,
                        };
                        let Some(blocks) = blocks.upgrade() else { return };
                        let refreshed = match received {
                            Ok(n) => blocks.refresh(&pool, n.payload()).await,
                            // The connection was lost: notifications may have been missed
                            // (recv reconnects on the next call).
                            Err(e) => {
                                if !failing {
                                    tracing::warn!(error = %e, "blocks listener lost its connection; reloading");
                                }
                                blocks.reload(&pool).await
                            }
                        };
                        match refreshed {
                            Ok(()) => failing = false,
                            Err(e) => {
                                if !std::mem::replace(&mut failing, true) {
                                    tracing::warn!(error = %e, "could not refresh rate-limit blocks; retrying every second");
                                }
                                tokio::time::sleep(Duration::from_secs(1)).await;
                            }
                        }
                    }
                });
                Ok(())
            })
            .await
            .map(|_| ())
    }

    async fn reload(&self, pool: &PgPool) -> Result<(), sqlx::Error> {
        let rows = sqlx::query!(
            "SELECT budget_key, courier_ts(blocked_until) AS \"until!\" FROM connection_blocks"
        )
        .fetch_all(pool)
        .await?;
        let mut map: HashMap<_, _> = rows.into_iter().map(|r| (r.budget_key, r.until)).collect();
        let heard = self.heard.lock().expect("heard lock");
        for (key, &h) in heard.iter() {
            let end = map.entry(key.clone()).or_insert(h);
            *end = (*end).max(h);
        }
        *self.until.write().expect("blocks lock") = map;
        Ok(())
    }

    /// Reads budget `key`'s block from the table into this copy (a NOTIFY does this; the
    /// throttle layer also asks before it makes a job wait, so a block lifted a moment ago
    /// is never waited out on a stale copy).
    pub async fn refresh(&self, pool: &PgPool, key: &str) -> Result<(), sqlx::Error> {
        let until = sqlx::query_scalar!(
            "SELECT courier_ts(blocked_until) AS \"until!\" FROM connection_blocks WHERE budget_key = $1",
            key
        )
        .fetch_optional(pool)
        .await?;
        let heard = self.heard.lock().expect("heard lock").get(key).copied();
        let mut map = self.until.write().expect("blocks lock");
        match until.max(heard) {
            Some(t) => map.insert(key.to_owned(), t),
            None => map.remove(key),
        };
        Ok(())
    }
}

/// A block in force, as `courier status` and the metrics show it.
#[derive(Debug)]
pub struct BlockLine {
    /// The budget blocked.
    pub budget_key: String,
    /// Until when.
    pub until: DateTime<Utc>,
    /// The rule whose call met the 429, while it exists.
    pub rule_id: Option<i64>,
    /// The raw `retry-after` of that 429.
    pub retry_after_raw: Option<String>,
}

/// The blocks in force at `now`.
pub async fn current(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
) -> Result<Vec<BlockLine>, sqlx::Error> {
    sqlx::query_as!(
        BlockLine,
        r#"SELECT budget_key, courier_ts(blocked_until) AS "until!", rule_id, retry_after_raw
           FROM connection_blocks WHERE blocked_until > $1"#,
        now
    )
    .fetch_all(db)
    .await
}

/// A block as it was set, with the names of who set it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockSet {
    /// When it was set (or last extended).
    pub set_at: DateTime<Utc>,
    /// Until when it holds (or held).
    pub blocked_until: DateTime<Utc>,
    /// The raw `retry-after` of the 429 behind it.
    pub retry_after_raw: Option<String>,
    /// The rule whose call met it, while the rule exists.
    pub rule: Option<String>,
    /// The connection whose call met it, while it exists.
    pub connection: Option<String>,
}

/// The blocks set after `after` (every block when `None`), in force or lapsed, oldest
/// first: one per budget, its latest.
pub async fn set_since(
    db: impl PgExecutor<'_>,
    after: Option<DateTime<Utc>>,
) -> Result<Vec<BlockSet>, sqlx::Error> {
    sqlx::query_as!(
        BlockSet,
        r#"SELECT courier_ts(b.set_at) AS "set_at!", courier_ts(b.blocked_until) AS "blocked_until!",
                  b.retry_after_raw, r.name AS "rule?", c.name AS "connection?"
           FROM connection_blocks b
           LEFT JOIN rules r ON r.id = b.rule_id
           LEFT JOIN connections c ON c.id = b.connection_id
           WHERE b.set_at > COALESCE($1::timestamptz, '-infinity') ORDER BY b.set_at"#,
        after
    )
    .fetch_all(db)
    .await
}

/// When the first block in force at `now` lapses.
pub async fn next_lapse(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT courier_ts(min(blocked_until)) FROM connection_blocks WHERE blocked_until > $1",
        now
    )
    .fetch_one(db)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_lengths_are_capped() {
        assert_eq!(block_length(None), Duration::from_secs(60));
        assert_eq!(
            block_length(Some(Duration::from_secs(86_401))),
            Duration::from_secs(86_400)
        );
        assert_eq!(block_length(Some(Duration::ZERO)), MIN_RATE_LIMIT_WAIT);
        assert_eq!(
            block_length(Some(Duration::from_millis(300))),
            MIN_RATE_LIMIT_WAIT
        );
    }

    #[test]
    fn a_block_is_extended_never_shortened() {
        let blocks = Blocks::default();
        let now = Utc::now();
        blocks.heard("k", now + chrono::Duration::seconds(10));
        blocks.written("k", now + chrono::Duration::seconds(5));
        assert_eq!(blocks.until("k"), Some(now + chrono::Duration::seconds(10)));
        assert_eq!(blocks.until("other"), None);
    }

    #[test]
    fn a_block_is_announced_once_until_it_is_over() {
        let blocks = Blocks::default();
        let now = Utc::now();
        let s = chrono::Duration::seconds;
        assert!(blocks.announce("k", now + s(10), now));
        assert!(
            !blocks.announce("k", now + s(20), now + s(1)),
            "an extension"
        );
        assert!(
            blocks.announce("k", now + s(40), now + s(30)),
            "the last one lapsed"
        );
        assert_eq!(blocks.take_announced("k"), Some(now + s(40)));
        assert_eq!(blocks.take_announced("k"), None, "said once");
        assert!(blocks.announce("k", now + s(50), now + s(41)));
    }
}
