//! `courier-bench bulk`: records delivered when a call carries many. Three parts, each
//! cell on a fresh database with one worker in this process:
//!
//! - **consents**: consent changes into one User.com workspace limited to 10 requests/s,
//!   as mass updates of up to 100 custom ids, and one per call on a sample of
//!   [`ONE_PER_CALL_SAMPLE`] (its drain for the whole burst is projected from its rate);
//! - **sink**: `http_json` records, 100 per call, into a batch sink at 10 requests/s with
//!   [`INVALID_EVERY`]th record invalid, answering all-or-nothing (the call is split until
//!   the bad records are alone) and per item;
//! - **throughput**: a target without limit, 100 per call against one per call.

use std::time::{Duration, Instant};

use courier::{
    catalog,
    enqueue::{self, NewDelivery},
    ledger::{self, DeliveryStatus},
};
use courier_target::{Target, TargetConfig, Window, WorkspaceConfig};
use serde_json::json;
use sqlx::PgPool;

use super::{
    BenchConfig, Report, Sample, Workers,
    fixtures::{TOKEN, connection, misjudged, new_connection, rule_per_call},
    fresh_database, watch,
};

/// Consent changes in the consents part, unless told.
pub const DEFAULT_RECORDS: usize = 20_000;
/// Records of the sink part.
pub const SINK_RECORDS: usize = 50_000;
/// Records of each throughput cell.
pub const THROUGHPUT_RECORDS: usize = 20_000;
/// Records the one-per-call consents cell sends (at 10/s, 100 s).
pub const ONE_PER_CALL_SAMPLE: usize = 1_000;
/// Every this many sink records, one is invalid (0.1%).
pub const INVALID_EVERY: usize = 1_000;
/// Records per call of the bulk cells.
pub const PER_CALL: i32 = 100;
/// The workspaces' limit, requests per second (User.com's).
const REAL_PER_SECOND: u32 = 10;
/// Longest a cell may take.
const CELL_LIMIT: Duration = Duration::from_secs(3_600);

/// What one cell measured.
struct Cell {
    records: usize,
    drain: f64,
    calls: u64,
    throttled: u64,
    timeline: Vec<Sample>,
}

impl Cell {
    fn per_second(&self) -> f64 {
        self.records as f64 / self.drain.max(f64::EPSILON)
    }

    /// Its figures in `report`, each name prefixed with `label`.
    fn report(&self, report: &mut Report, label: &str) {
        report.figure(&format!("{label}: records"), self.records as u64);
        report.figure(&format!("{label}: drain (s)"), self.drain);
        report.figure(&format!("{label}: calls"), self.calls);
        report.figure(&format!("{label}: records/s"), self.per_second());
        report.figure(&format!("{label}: 429s"), self.throttled);
    }
}

/// Runs the three parts; `records` consent changes in the first.
pub(super) async fn run(
    report: &mut Report,
    config: &BenchConfig,
    records: usize,
) -> anyhow::Result<()> {
    let sample = ONE_PER_CALL_SAMPLE.min(records);
    let one = consents(config, sample, 1).await?;
    one.report(report, "consents, 1 per call");
    report.figure(
        "consents, 1 per call: projected drain of the whole burst (s)",
        records as f64 / one.per_second(),
    );
    let bulk = consents(config, records, PER_CALL).await?;
    bulk.report(report, "consents, 100 per call");
    report.figure("consents: goal drain ≤ 30 s", bulk.drain <= 30.0);

    for (style, goal) in [("all-or-nothing", 130.0), ("per-item", 55.0)] {
        let (cell, exact) = sink(config, SINK_RECORDS, style).await?;
        let label = format!("sink {style}");
        cell.report(report, &label);
        let invalid = SINK_RECORDS / INVALID_EVERY;
        let bound = SINK_RECORDS as u64 / PER_CALL as u64 + invalid as u64 * 14;
        report.figure(&format!("{label}: invalid records"), invalid as u64);
        report.figure(
            &format!("{label}: exactly the invalid rejected, the rest delivered once"),
            exact,
        );
        report.figure(
            &format!("{label}: call bound (500 + 2·log2(100) each)"),
            bound,
        );
        report.figure(
            &format!("{label}: goal drain ≤ {goal} s"),
            cell.drain <= goal && cell.calls <= bound && exact,
        );
    }

    let single = unlimited(config, THROUGHPUT_RECORDS, 1).await?;
    single.report(report, "no limit, 1 per call");
    let many = unlimited(config, THROUGHPUT_RECORDS, PER_CALL).await?;
    many.report(report, "no limit, 100 per call");
    let gain = many.per_second() / single.per_second();
    report.figure("no limit: 100 per call ÷ 1 per call", gain);
    report.figure("no limit: goal ≥ 2×", gain >= 2.0);

    report.timeline = bulk.timeline;
    report.declared_per_second = Some(f64::from(REAL_PER_SECOND));
    Ok(())
}

/// `n` consent changes (`email_consent`, true for two thirds) for users the workspace
/// already has, sent `per_call` to a call.
async fn consents(config: &BenchConfig, n: usize, per_call: i32) -> anyhow::Result<Cell> {
    let (pool, _) = fresh_database(config).await?;
    let mut workspace = WorkspaceConfig::new("bench", TOKEN);
    workspace.custom_attributes = Some(["email_consent".to_owned()].into());
    let target = Target::start_with(TargetConfig {
        workspaces: vec![workspace],
        rate: REAL_PER_SECOND,
        window: Window::Fixed,
        ..TargetConfig::default()
    })
    .await?;
    // The users exist: the import changes their consent.
    target.seed_records("bench", "users", (0..n).map(|i| format!("c{i}")));
    let rpm = (REAL_PER_SECOND * 60) as i32;
    connection(
        &pool,
        "workspace",
        "usercom",
        target.workspace_url("bench"),
        rpm,
        8,
    )
    .await?;
    rule_per_call(
        &pool,
        "consents",
        "workspace",
        "usercom-attributes",
        per_call,
    )
    .await?;
    let changes = (0..n)
        .map(|i| {
            NewDelivery::new(
                format!("consent:c{i}"),
                json!({"custom_id": format!("c{i}"), "attributes": {"email_consent": i % 3 != 0}}),
            )
        })
        .collect();
    let cell = drain(config, &pool, &target, "consents", changes).await?;
    pool.close().await;
    Ok(cell)
}

/// `n` `http_json` records into the batch sink of a workspace at 10 requests/s answering in
/// `style`; also whether exactly the invalid records were rejected and every other one
/// delivered once.
async fn sink(config: &BenchConfig, n: usize, style: &str) -> anyhow::Result<(Cell, bool)> {
    let (pool, _) = fresh_database(config).await?;
    let target = Target::start_with(TargetConfig {
        workspaces: vec![WorkspaceConfig::new("bench", TOKEN)],
        rate: REAL_PER_SECOND,
        window: Window::Fixed,
        ..TargetConfig::default()
    })
    .await?;
    let rpm = (REAL_PER_SECOND * 60) as i32;
    let mut sink = new_connection("sink", "http_json", target.workspace_url("bench"), rpm, 8);
    // The workspace wants its token; the generic writer sends the connection's headers.
    sink.headers
        .insert("Authorization".into(), format!("Token {TOKEN}").into());
    catalog::upsert_connection(&pool, &sink).await?;
    let path = format!("batch/{style}/");
    rule_per_call(&pool, "records", "sink", &path, PER_CALL).await?;
    let records = (0..n)
        .map(|i| {
            let payload = match i % INVALID_EVERY == INVALID_EVERY / 2 {
                true => json!({"n": i, "invalid": true}),
                false => json!({"n": i}),
            };
            NewDelivery::new(format!("record:{i}"), payload)
        })
        .collect();
    let cell = drain(config, &pool, &target, "records", records).await?;
    let wrong = misjudged(&pool).await?;
    let delivered = ledger::status_counts(&pool)
        .await?
        .total(&[DeliveryStatus::Delivered]);
    let c = target.counters();
    let exact = wrong == 0 && c.duplicates == 0 && c.accepted_keys as i64 == delivered;
    pool.close().await;
    Ok((cell, exact))
}

/// `n` `http_json` records into a target without limit, `per_call` to a call.
async fn unlimited(config: &BenchConfig, n: usize, per_call: i32) -> anyhow::Result<Cell> {
    let (pool, _) = fresh_database(config).await?;
    let target = Target::start(0).await?;
    connection(&pool, "open", "http_json", target.url(), 60_000_000, 64).await?;
    rule_per_call(&pool, "records", "open", "batch/per-item/", per_call).await?;
    let records = (0..n)
        .map(|i| NewDelivery::new(format!("record:{i}"), json!({"n": i})))
        .collect();
    let cell = drain(config, &pool, &target, "records", records).await?;
    pool.close().await;
    Ok(cell)
}

/// Enqueues `records` for `rule`, runs a worker until they are drained, and measures.
async fn drain(
    config: &BenchConfig,
    pool: &PgPool,
    target: &Target,
    rule: &str,
    records: Vec<NewDelivery>,
) -> anyhow::Result<Cell> {
    let n = records.len();
    enqueue::enqueue_many(pool, rule, records).await?;
    let started = Instant::now();
    let workers = Workers::in_process(pool, &config.settings);
    let timeline = watch(pool, target, started, CELL_LIMIT).await?;
    workers.stop().await?;
    let drain = ledger::totals(pool).await?.enqueued_to_finished_secs;
    let c = target.counters();
    Ok(Cell {
        records: n,
        drain,
        calls: c.requests,
        throttled: c.throttled,
        timeline,
    })
}
