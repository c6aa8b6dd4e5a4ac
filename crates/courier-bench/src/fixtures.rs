//! What the scenarios set up alike: the bench workspace's token and key variable, its
//! connections and rules (saved through the catalog), the records they enqueue, and the
//! check of a run whose invalid records must be the rejected ones.

use courier::{
    catalog::{self, NewConnection, NewRule},
    enqueue::NewDelivery,
};
use courier_target::Target;
use serde_json::json;
use sqlx::PgPool;

/// The environment variable bench connections read their (fake) User.com key from.
pub(super) const KEY_VAR: &str = "COURIER_BENCH_USERCOM_KEY";
/// The bench workspace's token.
pub(super) const TOKEN: &str = "bench-token";

/// Connection `name` of `writer` at `base_url`, declaring `rpm` with at most `in_flight`
/// calls (a `usercom` one reads its key from [`KEY_VAR`]), as the catalog is given it.
pub(super) fn new_connection(
    name: &str,
    writer: &str,
    base_url: String,
    rpm: i32,
    in_flight: i32,
) -> NewConnection {
    NewConnection {
        name: name.into(),
        writer: writer.into(),
        base_url,
        api_key_env: (writer == "usercom").then(|| KEY_VAR.into()),
        requests_per_minute: Some(rpm),
        max_in_flight: Some(in_flight),
        timeout_ms: Some(10_000),
        ..Default::default()
    }
}

/// Saves [`new_connection`]; returns its id.
pub(super) async fn connection(
    pool: &PgPool,
    name: &str,
    writer: &str,
    base_url: String,
    rpm: i32,
    in_flight: i32,
) -> anyhow::Result<i64> {
    let c = new_connection(name, writer, base_url, rpm, in_flight);
    Ok(catalog::upsert_connection(pool, &c).await?)
}

/// The bench workspace's User.com connection, declaring `rpm` with at most `in_flight`
/// calls, and the rule `customers` on it (`user_upsert`, batches of 100).
pub(super) async fn customers_on_workspace(
    pool: &PgPool,
    target: &Target,
    rpm: i32,
    in_flight: i32,
) -> anyhow::Result<()> {
    connection(
        pool,
        "workspace",
        "usercom",
        target.workspace_url("bench"),
        rpm,
        in_flight,
    )
    .await?;
    rule(pool, "customers", "workspace", "user_upsert", 100).await
}

/// Rule `name` on `conn` at `path`, `batch` deliveries per chain job.
pub(super) async fn rule(
    pool: &PgPool,
    name: &str,
    conn: &str,
    path: &str,
    batch: i32,
) -> anyhow::Result<()> {
    catalog::upsert_rule(
        pool,
        &NewRule {
            name: name.into(),
            connection: conn.into(),
            path: path.into(),
            batch_size: Some(batch),
            ..Default::default()
        },
    )
    .await?;
    Ok(())
}

/// Rule `name` on `conn` sending up to `per_call` records per call (batches of 100).
pub(super) async fn rule_per_call(
    pool: &PgPool,
    name: &str,
    conn: &str,
    path: &str,
    per_call: i32,
) -> anyhow::Result<()> {
    catalog::upsert_rule(
        pool,
        &NewRule {
            name: name.into(),
            connection: conn.into(),
            path: path.into(),
            batch_size: Some(100),
            records_per_call: Some(per_call),
            ..Default::default()
        },
    )
    .await?;
    Ok(())
}

/// `n` User.com users keyed `<prefix>:<i>`.
pub(super) fn users(prefix: &str, n: usize) -> Vec<NewDelivery> {
    (0..n)
        .map(|i| {
            NewDelivery::new(
                format!("{prefix}:{i}"),
                json!({"custom_id": format!("{prefix}-{i}"), "email": format!("{prefix}{i}@example.com")}),
            )
        })
        .collect()
}

/// Deliveries judged wrong by a run whose records carry `"invalid": true` where the target
/// must refuse them: an invalid one not rejected, a valid one rejected, or any one left
/// neither delivered nor rejected. The bench's own measurement, over the documented
/// `deliveries` table and the payloads it enqueued.
pub(super) async fn misjudged(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM deliveries
         WHERE (payload ? 'invalid') <> (status = 'rejected')
            OR status NOT IN ('delivered', 'rejected')",
    )
    .fetch_one(pool)
    .await?)
}
