//! The record path on a fresh table: a first bulk import by plain SQL, never analysed, as a
//! new install (or a server with autovacuum off) has it. The planner then believes what no
//! statistics contradict (partial indexes built on an empty table hold nothing, 0.5% of
//! the rows are pending), and a statement whose plan hangs on that belief reads the whole
//! backlog for every batch, or for every row. Each statement of the path is checked by
//! what it really reads, through the function the chain calls: rows of `deliveries`
//! fetched per row handled (`pg_stat_xact_user_tables`, this transaction's counts), not
//! by time. Supersession, decided at enqueue (the claim no longer looks for a newer
//! delivery), is checked through the chain for plain-SQL enqueues.

use crate::common::*;
use chrono::{Duration as Span, Utc};
use courier::{
    chain::claim::{self, ClaimScope},
    enqueue::{self, NewDelivery},
    ledger::{self, Entry, Outcome},
    ops,
};
use serde_json::json;
use sqlx::{PgConnection, PgPool};

/// Rows of a first import, where the claim's slow plan showed (issue #40).
const BACKLOG: i64 = 20_000;
/// Rows of a larger import. Below some 70,000 rows of this width, a batch's outcomes are
/// found by one pass over the table, fresh or analysed alike (the planner's choice on
/// what it knows: a sequential pass costs less than 1,000 random probes, it reckons);
/// above, by the primary key, unless the plan hangs on a fresh table's beliefs.
const LARGE_BACKLOG: i64 = 100_000;
/// Deliveries per claim, as a worker's batch.
const BATCH: i32 = 1_000;
/// Rows of `deliveries` a statement may read per row it handles: the claim reads one, the
/// record five (the row updated, its ledger row's foreign key, its payload for
/// `delivered_records`, a dependant found and released). The slow plans read the whole
/// backlog per batch (over 100 per row here) or per row (thousands).
const ROWS_READ_PER_ROW: i64 = 8;

/// Rows of `deliveries` read so far in this transaction: sequential scans' rows and rows
/// fetched through any index.
async fn rows_read(tx: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT (seq_tup_read + coalesce(idx_tup_fetch, 0))::bigint
         FROM pg_stat_xact_user_tables WHERE relname = 'deliveries'",
    )
    .fetch_one(tx)
    .await
    .unwrap()
}

/// `deliveries` has never been analysed (nor vacuumed): the planner knows its size only
/// from its pages, and nothing of its columns.
async fn assert_fresh(pool: &PgPool) {
    let (tuples, analysed): (f32, bool) = sqlx::query_as(
        "SELECT c.reltuples, s.last_analyze IS NOT NULL OR s.last_autoanalyze IS NOT NULL
         FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
         WHERE c.relname = 'deliveries'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(
        tuples < 0.0 && !analysed,
        "deliveries has statistics (autovacuum?): these checks need a table without"
    );
}

/// A fresh shop with `backlog` deliveries of rule `customers` inserted by one plain
/// INSERT (payloads of 80 bytes), some keys twice, and the first quarter already delivered, as a run's progress
/// leaves them; `held` orders (rule `orders`) wait each for one customer key of the
/// rest, in order (`depends_on`), due in an hour. Returns the connection's id and the customers' rule id.
async fn imported(
    db: &TestDb,
    target: &courier_target::Target,
    backlog: i64,
    held: i64,
) -> (i64, i64) {
    setup(&db.pool, target, &["customers", "orders"], BATCH, 1).await;
    sqlx::query(
        "INSERT INTO deliveries (rule_id, record_key, payload)
         SELECT r.id, 'customer:' || (g % ($1 * 3 / 4)),
                jsonb_build_object('n', g, 'name', repeat('x', 60))
         FROM rules r, generate_series(1, $1) g WHERE r.name = 'customers'",
    )
    .bind(backlog)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO deliveries (rule_id, record_key, payload, depends_on, next_attempt_at)
         SELECT r.id, 'order:' || g, '{}', 'customer:' || ($2 / 4 + g), now() + interval '1 hour'
         FROM rules r, generate_series(1, $1) g WHERE r.name = 'orders'",
    )
    .bind(held)
    .bind(backlog)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE deliveries SET status = 'delivered', attempts = 1, finished_at = now()
         WHERE id < (SELECT min(id) FROM deliveries) + $1 / 4",
    )
    .bind(backlog)
    .execute(&db.pool)
    .await
    .unwrap();
    assert_fresh(&db.pool).await;
    sqlx::query_as(
        "SELECT c.id, r.id FROM connections c JOIN rules r ON r.connection_id = c.id
         WHERE r.name = 'customers'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// The claim's scope past the delivered quarter.
async fn next_batch(pool: &PgPool, connection_id: i64, rule_id: i64) -> ClaimScope {
    let after_id: i64 = sqlx::query_scalar(
        "SELECT max(id) FROM deliveries WHERE rule_id = $1 AND status = 'delivered'",
    )
    .bind(rule_id)
    .fetch_one(pool)
    .await
    .unwrap();
    ClaimScope {
        rule_id,
        connection_id,
        after_id,
        limit: BATCH,
    }
}

#[tokio::test]
async fn the_claim_reads_one_row_per_claimed_row_on_a_fresh_table() {
    let db = TestDb::new().await;
    let target = courier_target::Target::start(0).await.unwrap();
    let (connection_id, rule_id) = imported(&db, &target, BACKLOG, 0).await;
    let now = Utc::now() + Span::seconds(5);

    let scope = next_batch(&db.pool, connection_id, rule_id).await;
    let mut tx = db.pool.begin().await.unwrap();
    let before = rows_read(&mut tx).await;
    let claimed = claim::read(&mut *tx, scope, now).await.unwrap();
    let read = rows_read(&mut tx).await - before;
    assert_eq!(claimed.len(), BATCH as usize);
    // Deciding "superseded" per claimed row, the claim walked every pending delivery of
    // the rule backwards for each (14,500 rows read per claimed row here).
    assert!(
        read <= ROWS_READ_PER_ROW * i64::from(BATCH),
        "the claim of {BATCH} deliveries read {read} rows of deliveries"
    );
}

#[tokio::test]
async fn recording_a_batch_reads_a_few_rows_per_outcome_on_a_fresh_table() {
    let db = TestDb::new().await;
    let target = courier_target::Target::start(0).await.unwrap();
    let (connection_id, rule_id) = imported(&db, &target, LARGE_BACKLOG, BACKLOG).await;
    let now = Utc::now() + Span::seconds(5);
    let run_id: i64 = sqlx::query_scalar(
        "INSERT INTO runs (rule_id, started_by) VALUES ($1, 'test') RETURNING id",
    )
    .bind(rule_id)
    .fetch_one(&db.pool)
    .await
    .unwrap();

    let scope = next_batch(&db.pool, connection_id, rule_id).await;
    let mut tx = db.pool.begin().await.unwrap();
    let claimed = claim::read(&mut *tx, scope, now).await.unwrap();
    let entries: Vec<Entry> = claimed
        .iter()
        .map(|d| Entry {
            delivery_id: d.id,
            outcome: Outcome::Delivered,
            attempt: 1,
            http_status: Some(200),
            error: None,
            duration_ms: Some(1),
            next_attempt_at: None,
            at: now,
        })
        .collect();
    let before = rows_read(&mut tx).await;
    ledger::record(&mut tx, run_id, rule_id, connection_id, &entries, &[], now)
        .await
        .unwrap();
    let read = rows_read(&mut tx).await - before;
    // Finding the batch's rows hashed every pending delivery (the planner took 0.5% of
    // them for pending), and releasing the orders held for the delivered customers walked
    // every delivery of the connection due later.
    assert!(
        read <= ROWS_READ_PER_ROW * i64::from(BATCH),
        "recording {BATCH} outcomes read {read} rows of deliveries"
    );
    // The record did its work: the orders held for these customers are due now.
    let released: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM deliveries WHERE record_key LIKE 'order:%' AND next_attempt_at <= $1",
    )
    .bind(now)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(released, i64::from(BATCH));
}

/// Enqueues by plain SQL, one statement per call.
async fn insert(pool: &PgPool, rule: &str, rows: &[(&str, serde_json::Value)]) -> Vec<i64> {
    let keys: Vec<&str> = rows.iter().map(|(k, _)| *k).collect();
    let payloads: Vec<serde_json::Value> = rows.iter().map(|(_, p)| p.clone()).collect();
    sqlx::query_scalar(
        "INSERT INTO deliveries (rule_id, record_key, payload)
         SELECT r.id, k, p FROM rules r, unnest($2::text[], $3::jsonb[]) WITH ORDINALITY AS t(k, p, n)
         WHERE r.name = $1 ORDER BY n RETURNING id",
    )
    .bind(rule)
    .bind(&keys)
    .bind(&payloads)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn error(pool: &PgPool, id: i64) -> Option<String> {
    sqlx::query_scalar("SELECT error FROM ledger WHERE delivery_id = $1 ORDER BY id DESC LIMIT 1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_newer_delivery_by_plain_sql_supersedes_the_older_one() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    // Two statements, and one statement holding the same key twice.
    let first = insert(&db.pool, "customers", &[("c:1", json!({"v": 1}))]).await[0];
    let second = insert(&db.pool, "customers", &[("c:1", json!({"v": 2}))]).await[0];
    let both = insert(
        &db.pool,
        "customers",
        &[("c:2", json!({"v": 1})), ("c:2", json!({"v": 2}))],
    )
    .await;
    // Through `enqueue` too.
    let other = enqueue::enqueue(&db.pool, "customers", NewDelivery::new("c:3", json!({})))
        .await
        .unwrap();

    drive(&engine).await;
    for old in [first, both[0]] {
        assert_eq!(delivery(&db.pool, old).await, ("suppressed".into(), 0));
        assert_eq!(
            error(&db.pool, old).await.as_deref(),
            Some("superseded by a newer delivery")
        );
    }
    for new in [second, both[1], other] {
        assert_eq!(delivery(&db.pool, new).await, ("delivered".into(), 1));
    }
    assert_eq!(target.counters().requests, 3);
}

#[tokio::test]
async fn an_older_delivery_in_backoff_stays_superseded_once_the_newer_is_delivered() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    target.respond_with(500, None);
    let old = insert(&db.pool, "customers", &[("c:1", json!({"v": 1}))]).await[0];
    drive(&engine).await;
    assert_eq!(delivery(&db.pool, old).await, ("pending".into(), 1));

    // The newer one goes out while the older waits for its next attempt.
    target.respond_with(200, None);
    engine.clock.advance(Span::milliseconds(1));
    let new = insert(&db.pool, "customers", &[("c:1", json!({"v": 2}))]).await[0];
    drive(&engine).await;
    assert_eq!(delivery(&db.pool, new).await, ("delivered".into(), 1));
    assert_eq!(delivery(&db.pool, old).await, ("pending".into(), 1));

    // Due again, the older one would overwrite the newer data at the target: it is
    // suppressed, never sent.
    engine.clock.advance(Span::minutes(5));
    drive(&engine).await;
    assert_eq!(delivery(&db.pool, old).await, ("suppressed".into(), 1));
    assert_eq!(target.counters().requests, 2);
}

#[tokio::test]
async fn a_retry_takes_only_the_newest_delivery_of_a_key() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    target.respond_with(422, None);
    let old = insert(&db.pool, "customers", &[("c:1", json!({"v": 1}))]).await[0];
    drive(&engine).await;
    let new = insert(&db.pool, "customers", &[("c:1", json!({"v": 2}))]).await[0];
    drive(&engine).await;
    assert_eq!(delivery(&db.pool, old).await, ("rejected".into(), 1));
    assert_eq!(delivery(&db.pool, new).await, ("rejected".into(), 1));

    target.respond_with(200, None);
    let n = ops::retry(&db.pool, "customers", &[Outcome::Rejected], None)
        .await
        .unwrap();
    assert_eq!(n, 1, "the newer record wins: the older one is not retried");
    drive(&engine).await;
    assert_eq!(delivery(&db.pool, new).await, ("delivered".into(), 1));
    assert_eq!(delivery(&db.pool, old).await, ("rejected".into(), 1));
}
