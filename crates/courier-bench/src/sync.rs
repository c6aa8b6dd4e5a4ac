//! `courier-bench initial-sync`: an initial sync of a shop's customers into Klaviyo through
//! its profile bulk import jobs. The Klaviyo preset's rule `klaviyo-profiles-bulk` (10,000
//! profiles per job) against `courier target` emulating the jobs with Klaviyo's published
//! limits on each job endpoint (create, get, errors: each its own, as
//! `presets/klaviyo.target.json` states them; 429 with `Retry-After` past them), jobs completing [`COMPLETE_AFTER`] after their submit, one
//! profile in [`INVALID_EVERY`] refused by the job. The profiles arrive by one INSERT;
//! one `courier worker` process delivers them; the drain runs from the INSERT to the last
//! record's final outcome (`delivered` or `rejected`, never `accepted`).

use std::time::{Duration, Instant};

use courier::{
    jobs,
    ledger::{self, DeliveryStatus},
};
use courier_target::{
    Target,
    jobs::{JobEnd, JobsConfig, call_limits},
};
use sqlx::PgPool;

use super::{BenchConfig, Child, Report, fixtures::misjudged, watch};

/// Profiles synced unless told.
pub const DEFAULT_RECORDS: usize = 1_000_000;
/// Every this many profiles, one is refused by its job (0.1%).
pub const INVALID_EVERY: usize = 1_000;
/// From a job's submit to its completion at the target.
pub const COMPLETE_AFTER: Duration = Duration::from_secs(3);
/// The rule synced through.
const RULE: &str = "klaviyo-profiles-bulk";
/// The goal: the whole sync within this.
const GOAL: Duration = Duration::from_secs(300);
/// Longest the sync may take.
const LIMIT: Duration = Duration::from_secs(1_800);

/// Runs the sync of `records` profiles.
pub(super) async fn run(
    report: &mut Report,
    config: &BenchConfig,
    pool: &PgPool,
    url: &str,
    records: usize,
) -> anyhow::Result<()> {
    let target = Target::start(0).await?;
    target.set_jobs(JobsConfig {
        complete_after: COMPLETE_AFTER,
        end: JobEnd::Complete,
        limited: true,
    });
    apply_preset(pool, &format!("{}api/", target.url())).await?;
    let started = Instant::now();
    insert_profiles(pool, records).await?;
    let insert_secs = started.elapsed().as_secs_f64();
    let worker = Child::spawn(url, &config.settings)?;
    let timeline = watch(pool, &target, started, LIMIT).await?;
    let drain = started.elapsed().as_secs_f64();
    let (peak_mib, cpu) = (worker.peak_rss_mib(), worker.cpu_seconds());
    worker.stop()?;
    let counts = ledger::status_counts(pool).await?;
    let delivered = counts.total(&[DeliveryStatus::Delivered]);
    let rejected = counts.total(&[DeliveryStatus::Rejected]);
    let wrong = misjudged(pool).await?;
    let jobs::Tally {
        jobs,
        polls: polls_made,
    } = jobs::tally(pool).await?;
    let c = target.counters();
    let path_calls = |part: &str| -> u64 {
        c.paths
            .iter()
            .filter(|(p, _)| p.ends_with(part))
            .map(|(_, n)| n)
            .sum()
    };
    let exact = wrong == 0 && c.duplicates == 0 && c.accepted_keys as i64 == delivered;
    report.figure("insert (s)", insert_secs);
    report.figure("drain, INSERT to every final outcome (s)", drain);
    report.figure("records/s", records as f64 / drain);
    report.figure("delivered", delivered as u64);
    report.figure(
        "rejected (the invalid, by their jobs' errors)",
        rejected as u64,
    );
    report.figure("every invalid rejected, every other delivered once", exact);
    report.figure("jobs", jobs as u64);
    report.figure("calls", c.requests);
    report.figure("submits", path_calls("profile-bulk-import-jobs"));
    report.figure("polls (target)", target.job_polls());
    report.figure("polls (courier's count)", polls_made as u64);
    report.figure("error pages", path_calls("import-errors"));
    report.figure("429s", c.throttled);
    report.figure("worker peak RSS (MiB)", peak_mib);
    report.figure("worker CPU (s)", cpu);
    report.figure(
        &format!("goal: the sync in under {} s", GOAL.as_secs()),
        drain <= GOAL.as_secs_f64() && exact,
    );
    report.timeline = timeline;
    // The steady limit of each job call, as the Klaviyo emulation states it.
    report.declared_per_second = call_limits("klaviyo")
        .into_iter()
        .max_by_key(|(_, period)| *period)
        .map(|(n, period)| f64::from(n) / period.as_secs_f64());
    Ok(())
}

/// `records` profiles for the rule by one INSERT, one in [`INVALID_EVERY`] marked invalid.
async fn insert_profiles(pool: &PgPool, records: usize) -> anyhow::Result<()> {
    let inserted = sqlx::query(
        "INSERT INTO deliveries (rule_id, record_key, payload)
         SELECT r.id, 'customer:' || g,
                jsonb_build_object('email', 'c' || g || '@example.com', 'first_name', 'C' || g,
                                   'properties', jsonb_build_object('orders', g % 7))
                || CASE WHEN g % $3 = $3 / 2 THEN '{\"invalid\": true}'::jsonb ELSE '{}' END
         FROM rules r, generate_series(1, $2) g WHERE r.name = $1",
    )
    .bind(RULE)
    .bind(records as i64)
    .bind(INVALID_EVERY as i64)
    .execute(pool)
    .await?
    .rows_affected();
    anyhow::ensure!(
        inserted as usize == records,
        "inserted {inserted} of {records}"
    );
    Ok(())
}

/// The Klaviyo preset, its connection on `base_url`, with only the bulk import rule.
async fn apply_preset(pool: &PgPool, base_url: &str) -> anyhow::Result<()> {
    let preset = courier::presets::find("klaviyo").map_err(anyhow::Error::msg)?;
    let mut file: serde_json::Value = serde_json::from_str(preset.text)?;
    file["connections"][0]["base_url"] = base_url.into();
    file["rules"]
        .as_array_mut()
        .expect("rules")
        .retain(|r| r["name"] == RULE);
    courier::apply::apply_file(pool, &file.to_string(), Default::default()).await?;
    if std::env::var("KLAVIYO_API_KEY").is_err() {
        // SAFETY: set once, before the worker process is spawned (it inherits it).
        unsafe { std::env::set_var("KLAVIYO_API_KEY", "bench-key") };
    }
    Ok(())
}
