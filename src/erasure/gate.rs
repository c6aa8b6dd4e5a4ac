//! The gate every claimed delivery passes before any call: one naming an erased person
//! (by an identity where its rule's `identities` say it sits, or by its record key) is
//! suppressed and its payload emptied at once. The database cannot tell (it never holds
//! the key the erased are remembered under), so each delivery's identities, normalized by
//! the claim (`courier_delivery_identities`), are hashed here and looked up in one query
//! per batch. An erasure asked but not yet hashed is hashed first, so a delivery enqueued a
//! moment after the request is stopped too. A process without the key holds deliveries back
//! once anyone is erased, rather than send what it cannot check.
//!
//! A delivery a run does not claim soon (its rule paused, its budget blocked, held) would
//! keep an erased person's payload until then: [`sweep_new`], on every dispatcher pass (woken
//! by each enqueue), checks the deliveries enqueued since its last look, by any door, and
//! suppresses and empties those naming the erased at once.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::{ErasureKey, store};
use crate::engine::Engine;

/// What the gate says of one delivery.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Passage {
    /// It may go.
    #[default]
    Clear,
    /// Its person is erased (by this erasure): suppressed, its payload emptied.
    Erased(i64),
    /// People are erased and this process has no key to check it against them: held.
    Unchecked,
}

/// What the held are told.
pub const UNCHECKED: &str = "people are erased and this worker has no COURIER_ERASURE_KEY to \
                             check deliveries against them: held until a worker with the key \
                             takes them";

/// The passage of each delivery `(id, identities)` of a batch claimed at `now`; those whose
/// person is erased are emptied in the database (and marked with their erasure) here.
pub async fn check(
    engine: &Engine,
    batch: &[(i64, &[String])],
    now: DateTime<Utc>,
) -> Result<Vec<Passage>, sqlx::Error> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    let pool = &engine.pool;
    let Some(key) = engine.settings.erasure_key.as_ref() else {
        let anyone = store::anyone(pool).await?;
        let passage = if anyone {
            Passage::Unchecked
        } else {
            Passage::Clear
        };
        return Ok(vec![passage; batch.len()]);
    };
    let hashed: Vec<Vec<String>> = batch
        .iter()
        .map(|(_, ids)| ids.iter().map(|i| key.hash(i)).collect())
        .collect();
    let all: Vec<String> = hashed.iter().flatten().cloned().collect();
    let erased = lookup(pool, key, &all).await?;
    let passages: Vec<Passage> = hashed
        .iter()
        .map(|hashes| {
            hashes
                .iter()
                .find_map(|h| erased.get(h).copied())
                .map_or(Passage::Clear, Passage::Erased)
        })
        .collect();
    let (ids, erasures): (Vec<i64>, Vec<i64>) = batch
        .iter()
        .zip(&passages)
        .filter_map(|((id, _), p)| match p {
            Passage::Erased(e) => Some((*id, *e)),
            _ => None,
        })
        .unzip();
    if !ids.is_empty() {
        sqlx::query!(
            "UPDATE deliveries d SET payload = '{}'::jsonb, erasure_id = x.erasure_id,
                    updated_at = $3
             FROM unnest($1::bigint[], $2::bigint[]) AS x(id, erasure_id)
             WHERE d.id = x.id AND d.status = 'pending'",
            &ids,
            &erasures,
            now
        )
        .execute(pool)
        .await?;
    }
    Ok(passages)
}

/// Deliveries checked at most per look.
const NEW_PER_LOOK: i64 = 5_000;

/// Checks the pending deliveries enqueued since the last look (`erasure_gate.swept_to`)
/// against the erased by keyed hash, and suppresses and empties those naming one; one
/// process looks at a time, and while nobody is erased a look only moves the mark. Returns
/// how many it suppressed.
pub async fn sweep_new(engine: &Engine, now: DateTime<Utc>) -> Result<u64, sqlx::Error> {
    let Some(key) = engine.settings.erasure_key.as_ref() else {
        return Ok(0);
    };
    let pool = &engine.pool;
    let mut tx = pool.begin().await?;
    let Some(from) = store::gate_mark(&mut tx).await? else {
        return Ok(0); // another process is looking
    };
    if !store::anyone(&mut *tx).await? {
        store::gate_moved(&mut tx, None).await?;
        tx.commit().await?;
        return Ok(0);
    }
    let new = store::new_deliveries(&mut tx, from, NEW_PER_LOOK).await?;
    let Some(last) = new.last().map(|(id, _)| *id) else {
        tx.commit().await?;
        return Ok(0);
    };
    let hashed: Vec<Vec<String>> = new
        .iter()
        .map(|(_, ids)| ids.iter().map(|i| key.hash(i)).collect())
        .collect();
    let all: Vec<String> = hashed.iter().flatten().cloned().collect();
    let erased = lookup(pool, key, &all).await?;
    let (ids, erasures): (Vec<i64>, Vec<i64>) = new
        .iter()
        .zip(&hashed)
        .filter_map(|((id, _), hashes)| {
            let erasure = hashes.iter().find_map(|h| erased.get(h).copied())?;
            Some((*id, erasure))
        })
        .unzip();
    let suppressed = store::suppress(&mut tx, &ids, &erasures, now).await?;
    store::gate_moved(&mut tx, Some(last)).await?;
    tx.commit().await?;
    Ok(suppressed)
}

/// The erased among `hashes`, by the erasure that erased each; an erasure asked but not yet
/// hashed is hashed first.
async fn lookup(
    pool: &sqlx::PgPool,
    key: &ErasureKey,
    hashes: &[String],
) -> Result<HashMap<String, i64>, sqlx::Error> {
    for _ in 0..2 {
        let rows = sqlx::query!(
            r#"SELECT h.hash AS "hash?", h.erasure_id AS "erasure_id?"
               FROM erased_identities h WHERE h.hash = ANY($1)
               UNION ALL
               SELECT NULL, NULL WHERE EXISTS (
                   SELECT 1 FROM erasures WHERE status = 'open' AND NOT hashed)"#,
            hashes
        )
        .fetch_all(pool)
        .await?;
        let unhashed = rows.iter().any(|r| r.hash.is_none());
        if !unhashed {
            return Ok(rows
                .into_iter()
                .filter_map(|r| Some((r.hash?, r.erasure_id?)))
                .collect());
        }
        store::hash_open(pool, key).await?;
    }
    // Hashed by now, unless one was asked in between: the next claim sees it.
    let rows = sqlx::query!(
        "SELECT h.hash, h.erasure_id FROM erased_identities h WHERE h.hash = ANY($1)",
        hashes
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.hash, r.erasure_id)).collect())
}
