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

/// The User.com preset (`presets/usercom.json`).
fn usercom() -> &'static courier::presets::Preset {
    courier::presets::find("usercom").expect("the User.com preset is built in")
}

/// Connection `name` of `writer` at `base_url`, declaring `rpm` with at most `in_flight`
/// calls, as the catalog is given it. `usercom` names the User.com preset's connection
/// (http_json, its key from [`KEY_VAR`], `rpm` in place of the preset's limits).
pub(super) fn new_connection(
    name: &str,
    writer: &str,
    base_url: String,
    rpm: i32,
    in_flight: i32,
) -> NewConnection {
    let base = match writer {
        "usercom" => {
            let mut c = usercom().connection(&json!({"api_key_env": KEY_VAR}));
            c.remove("limits");
            serde_json::from_value(c.into()).expect("the preset's connection reads")
        }
        _ => NewConnection {
            writer: writer.into(),
            ..Default::default()
        },
    };
    NewConnection {
        name: name.into(),
        base_url,
        requests_per_minute: Some(rpm),
        max_in_flight: Some(in_flight),
        timeout_ms: Some(10_000),
        ..base
    }
}

/// Rule `name` on `conn` at `path`, `batch` deliveries per chain job, up to `per_call`
/// records per call; a `path` naming a rule of the User.com preset (`usercom-users`) takes
/// that rule's path and shapes.
fn new_rule(name: &str, conn: &str, path: &str, batch: i32, per_call: i32) -> NewRule {
    let base = match path.starts_with("usercom-") {
        true => {
            let r = usercom()
                .rule(Some(path), &json!({}))
                .expect("a rule of the preset");
            serde_json::from_value(r.into()).expect("the preset's rule reads")
        }
        false => NewRule {
            path: path.into(),
            ..Default::default()
        },
    };
    NewRule {
        name: name.into(),
        connection: conn.into(),
        batch_size: Some(batch),
        records_per_call: Some(per_call),
        ..base
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
/// calls, and the rule `customers` on it (the preset's `usercom-users`, batches of 100).
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
    rule(pool, "customers", "workspace", "usercom-users", 100).await
}

/// Rule `name` on `conn` at `path` ([`new_rule`]), `batch` deliveries per chain job.
pub(super) async fn rule(
    pool: &PgPool,
    name: &str,
    conn: &str,
    path: &str,
    batch: i32,
) -> anyhow::Result<()> {
    catalog::upsert_rule(pool, &new_rule(name, conn, path, batch, 1)).await?;
    Ok(())
}

/// Rule `name` on `conn` ([`new_rule`]) sending up to `per_call` records per call (batches
/// of 100).
pub(super) async fn rule_per_call(
    pool: &PgPool,
    name: &str,
    conn: &str,
    path: &str,
    per_call: i32,
) -> anyhow::Result<()> {
    catalog::upsert_rule(pool, &new_rule(name, conn, path, 100, per_call)).await?;
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
