//! `courier-bench erasure`: people erased at once. Each is first a customer courier
//! delivered into three targets (the HubSpot, Brevo and Mailchimp presets' customer rules
//! against `courier target`, which keeps the people each vendor's endpoints write); then
//! one statement asks to erase them all (`courier_erase` per person), and one `courier
//! worker` process carries the erasures out, each connection's deletes paced at its
//! preset's limits (HubSpot 100/10 s, Brevo and Mailchimp 10/s). The figure is the time from
//! that statement to every target's answer and courier's purge of every erasure, with what
//! is left of the people at the targets and in courier's tables (nothing, when it works).

use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::{BenchConfig, Child, Report};
use courier_target::Target;

/// People erased unless told.
pub const DEFAULT_RECORDS: usize = 1_000;
/// The presets, their customer rule, and a customer's payload there (`{e}`: the e-mail).
const TARGETS: [(&str, &str, &str); 3] = [
    (
        "hubspot",
        "hubspot-contacts",
        r#"{"email": "{e}", "firstname": "C"}"#,
    ),
    (
        "brevo",
        "brevo-contacts",
        r#"{"email": "{e}", "firstname": "C"}"#,
    ),
    (
        "mailchimp",
        "mailchimp-members",
        r#"{"email_address": "{e}", "status": "subscribed"}"#,
    ),
];
/// Longest either phase may take.
const LIMIT: Duration = Duration::from_secs(1_800);

/// Runs the scenario with `people` people.
pub(super) async fn run(
    report: &mut Report,
    config: &BenchConfig,
    pool: &PgPool,
    url: &str,
    people: usize,
) -> anyhow::Result<()> {
    let target = Target::start(0).await?;
    for (preset, rule, payload) in TARGETS {
        apply_preset(pool, preset, rule, &target.url()).await?;
        insert_customers(pool, rule, payload, people).await?;
    }
    if std::env::var("COURIER_ERASURE_KEY").is_err() {
        // SAFETY: set once, before the worker process is spawned (it inherits it).
        unsafe {
            std::env::set_var(
                "COURIER_ERASURE_KEY",
                "bench-erasure-key-0123456789abcdef01234",
            )
        };
    }
    let worker = Child::spawn(url, &config.settings)?;
    let started = Instant::now();
    let everyone = (TARGETS.len() * people) as i64;
    wait(
        pool,
        "every customer delivered",
        "SELECT count(*) FROM deliveries WHERE status = 'delivered'",
        everyone,
    )
    .await?;
    let delivered_secs = started.elapsed().as_secs_f64();
    let at_targets: usize = TARGETS.iter().map(|(p, ..)| target.contacts(p).len()).sum();
    let calls_before = target.counters().requests;
    let asked = Instant::now();
    sqlx::query(
        "SELECT count(courier_erase(jsonb_build_object('email', 'c' || g || '@example.com'),
                                    'courier-bench'))
         FROM generate_series(1, $1) g",
    )
    .bind(people as i64)
    .execute(pool)
    .await?;
    let ask_secs = asked.elapsed().as_secs_f64();
    wait(
        pool,
        "every erasure closed",
        "SELECT count(*) FROM erasures WHERE status = 'done'",
        people as i64,
    )
    .await?;
    let erased_secs = asked.elapsed().as_secs_f64();
    let cpu = worker.cpu_seconds();
    worker.stop()?;
    let c = target.counters();
    let left_at_targets: usize = TARGETS.iter().map(|(p, ..)| target.contacts(p).len()).sum();
    let (left_in_courier, outcomes) = what_is_left(pool).await?;
    report.figure("people", people as u64);
    report.figure("customers delivered first (s)", delivered_secs);
    report.figure("people at the targets before", at_targets as u64);
    report.figure("asking, one statement (s)", ask_secs);
    report.figure(
        "request to every target answered and courier purged (s)",
        erased_secs,
    );
    for (connection, outcome, n, secs) in &outcomes {
        report.figure(&format!("{connection}: {outcome}"), *n as u64);
        report.figure(&format!("{connection}: last answer after (s)"), *secs);
    }
    report.figure("erase calls", c.requests - calls_before);
    report.figure("429s", c.throttled);
    report.figure("people left at the targets", left_at_targets as u64);
    report.figure("rows of theirs left in courier", left_in_courier as u64);
    report.figure("worker CPU (s)", cpu);
    Ok(())
}

/// Rows of the erased people left in courier's tables, and each connection's parts by
/// outcome with the time from the request to its last answer.
async fn what_is_left(pool: &PgPool) -> anyhow::Result<(i64, Vec<(String, String, i64, f64)>)> {
    let left_in_courier: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM deliveries) + (SELECT count(*) FROM delivered_records)
              + (SELECT count(*) FROM ledger WHERE error LIKE '%@example.com%')
              + (SELECT count(*) FROM erasures WHERE identities IS NOT NULL)",
    )
    .fetch_one(pool)
    .await?;
    let outcomes: Vec<(String, String, i64, f64)> = sqlx::query_as(
        "SELECT connection, outcome, count(*),
                extract(epoch FROM max(t.answered_at) - min(e.asked_at))::float8
         FROM erasure_targets t JOIN erasures e ON e.id = t.erasure_id
         GROUP BY connection, outcome ORDER BY connection, outcome",
    )
    .fetch_all(pool)
    .await?;
    Ok((left_in_courier, outcomes))
}

/// Preset `preset` with only `rule`, its connection on the target (the vendor's path
/// prefix kept), its variables set.
async fn apply_preset(pool: &PgPool, preset: &str, rule: &str, target: &str) -> anyhow::Result<()> {
    let found = courier::presets::find(preset).map_err(anyhow::Error::msg)?;
    let mut file: serde_json::Value = serde_json::from_str(found.text)?;
    let connection = &mut file["connections"][0];
    let base = connection["base_url"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let prefix = base
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map_or("", |(_, path)| path);
    connection["base_url"] = format!("{target}{prefix}").into();
    for var in [&connection["api_key_env"], &connection["auth"]["user_env"]]
        .into_iter()
        .filter_map(serde_json::Value::as_str)
    {
        if std::env::var(var).is_err() {
            // SAFETY: set before the worker process is spawned (it inherits them).
            unsafe { std::env::set_var(var, "bench-key") };
        }
    }
    file["rules"]
        .as_array_mut()
        .expect("rules")
        .retain(|r| r["name"] == rule);
    courier::apply::apply_file(pool, &file.to_string(), Default::default()).await?;
    Ok(())
}

/// `people` customers `c<i>@example.com` for `rule`, by one INSERT.
async fn insert_customers(
    pool: &PgPool,
    rule: &str,
    payload: &str,
    people: usize,
) -> anyhow::Result<()> {
    let (before, after) = payload.split_once("{e}").expect("a payload names {e}");
    sqlx::query(
        "INSERT INTO deliveries (rule_id, record_key, payload)
         SELECT r.id, 'customer:' || g, ($2 || 'c' || g || '@example.com' || $3)::jsonb
         FROM rules r, generate_series(1, $4) g WHERE r.name = $1",
    )
    .bind(rule)
    .bind(before)
    .bind(after)
    .bind(people as i64)
    .execute(pool)
    .await?;
    Ok(())
}

/// Waits until `count` reads `n` (checked every 200 ms, for at most [`LIMIT`]).
async fn wait(pool: &PgPool, what: &str, count: &str, n: i64) -> anyhow::Result<()> {
    let until = Instant::now() + LIMIT;
    while Instant::now() < until {
        let got: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count.to_owned()))
            .fetch_one(pool)
            .await?;
        if got >= n {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("{what}: not within {} s", LIMIT.as_secs())
}
