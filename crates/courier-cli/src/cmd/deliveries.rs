//! `courier enqueue`, `courier retry`, `courier history` and `courier status`: putting
//! deliveries in, taking failed ones back, and reading what became of them.

use std::{io::Read, path::PathBuf};

use anyhow::Context;
use courier::{enqueue, ledger::Outcome, ops, status};
use courier_cli::tables;

use super::Ctx;

/// `courier enqueue`'s arguments.
#[derive(clap::Args)]
pub struct EnqueueArgs {
    /// The rule's name.
    #[arg(long)]
    rule: String,
    /// NDJSON file; stdin when absent.
    #[arg(long)]
    file: Option<PathBuf>,
}

/// The outcomes `courier retry` takes back.
#[derive(Clone, Copy, clap::ValueEnum)]
enum RetryOutcome {
    Exhausted,
    Rejected,
}

/// `courier retry`'s arguments.
#[derive(clap::Args)]
pub struct RetryArgs {
    /// The rule's name.
    #[arg(long)]
    rule: String,
    /// Which deliveries: exhausted (default) or rejected (repeatable).
    #[arg(long = "outcome", value_enum)]
    outcomes: Vec<RetryOutcome>,
    /// Only those that ended at or after this time: RFC 3339
    /// (`2026-11-30T12:00:00Z`), a date (`2026-11-30`, UTC) or an age (`90m`, `2h`, `1d`).
    #[arg(long, value_parser = parse_since)]
    since: Option<chrono::DateTime<chrono::Utc>>,
}

/// `courier history`'s arguments.
#[derive(clap::Args)]
pub struct HistoryArgs {
    /// The record key.
    key: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `courier status`'s arguments.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// `--since`: an RFC 3339 time, a date (midnight UTC), or an age before now (`45s`, `90m`,
/// `2h`, `1d`).
fn parse_since(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    let s = s.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.to_utc());
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.and_time(chrono::NaiveTime::MIN).and_utc());
    }
    let unit = s.chars().last().unwrap_or(' ');
    let n: Option<i64> = s[..s.len() - unit.len_utf8().min(s.len())].parse().ok();
    let age = match (n, unit) {
        (Some(n), 's') => chrono::Duration::try_seconds(n),
        (Some(n), 'm') => chrono::Duration::try_minutes(n),
        (Some(n), 'h') => chrono::Duration::try_hours(n),
        (Some(n), 'd') => chrono::Duration::try_days(n),
        _ => None,
    };
    match age {
        Some(age) if age >= chrono::Duration::zero() => Ok(chrono::Utc::now() - age),
        _ => Err(format!(
            "{s:?} is not a time: give RFC 3339 (2026-11-30T12:00:00Z), a date (2026-11-30) \
             or an age (90m, 2h, 1d)"
        )),
    }
}

/// Runs `courier enqueue`: NDJSON from the file or stdin, all or nothing.
pub async fn enqueue(ctx: &Ctx, args: EnqueueArgs) -> anyhow::Result<()> {
    let mut input = String::new();
    match args.file {
        Some(path) => {
            input = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?
        }
        None => {
            std::io::stdin().read_to_string(&mut input)?;
        }
    }
    let deliveries = enqueue::parse_ndjson(&input)?;
    let n = deliveries.len();
    enqueue::enqueue_many(&ctx.pool().await?, &args.rule, deliveries).await?;
    println!("enqueued {n} deliveries for rule {}", args.rule);
    Ok(())
}

/// Runs `courier retry`.
pub async fn retry(ctx: &Ctx, args: RetryArgs) -> anyhow::Result<()> {
    let RetryArgs {
        rule,
        outcomes,
        since,
    } = args;
    let outcomes: Vec<Outcome> = if outcomes.is_empty() {
        vec![Outcome::Exhausted]
    } else {
        outcomes
            .iter()
            .map(|o| match o {
                RetryOutcome::Exhausted => Outcome::Exhausted,
                RetryOutcome::Rejected => Outcome::Rejected,
            })
            .collect()
    };
    let n = ops::retry(&ctx.pool().await?, &rule, &outcomes, since).await?;
    let which: Vec<&str> = outcomes.iter().map(|o| o.as_str()).collect();
    let since = since.map_or(String::new(), |t| {
        format!(" ended since {}", t.format("%Y-%m-%d %H:%M:%S UTC"))
    });
    println!(
        "rule {rule}: {n} {} deliver{}{since} made pending again",
        which.join(" or "),
        if n == 1 { "y" } else { "ies" }
    );
    Ok(())
}

/// Runs `courier history`.
pub async fn history(ctx: &Ctx, args: HistoryArgs) -> anyhow::Result<()> {
    let key = args.key;
    let entries = ops::history(&ctx.pool().await?, &key).await?;
    anyhow::ensure!(
        !entries.is_empty(),
        "no delivery has record key {key:?} (never enqueued, or removed by retention)"
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
                e.rule.clone(),
                e.delivery_id.to_string(),
                e.outcome.map_or("enqueued", |o| o.as_str()).to_owned(),
                e.run_id.map_or("-".into(), |r| r.to_string()),
                e.attempt.map_or("-".into(), |a| a.to_string()),
                e.http_status.map_or("-".into(), |h| h.to_string()),
                e.status.as_str().to_owned(),
                e.detail.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let headers = [
        "at", "rule", "delivery", "event", "run", "attempt", "http", "now", "detail",
    ];
    print!("{}", tables::table(&headers, &rows));
    Ok(())
}

/// Runs `courier status`.
pub async fn status(ctx: &Ctx, args: StatusArgs) -> anyhow::Result<()> {
    let window = ctx.settings.worker_dead_after;
    let pool = ctx.pool().await?;
    // The database's time: what every worker keeps time by.
    let now = courier::clock::Clock::synced(&pool).await?.now();
    let report = status::report_with(&pool, now, window).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", tables::status(&report));
    }
    Ok(())
}
