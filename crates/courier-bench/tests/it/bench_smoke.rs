//! Small versions of the `pacing` and `storm` benchmarks: they assert correctness only
//! (everything delivered, nothing failed, no attempt spent on a 429), never speed.

use crate::common::*;
use courier_bench::{self as bench, BenchConfig, Scenario};

async fn smoke(scenario: Scenario, records: usize) -> bench::Report {
    let database = format!("courier_test_bench_{:08x}", rand::random::<u32>());
    // The bench creates it; dropped when the smoke passes, kept when it fails.
    let _drop = DropDatabase::new(&database);
    let report = bench::run(
        scenario,
        BenchConfig {
            server_url: server_url(),
            database: database.clone(),
            records: Some(records),
            workers: None,
            out_dir: None,
            settings: settings(&server_url()),
            chaos: Default::default(),
            limits: Default::default(),
        },
    )
    .await
    .unwrap();
    let n = |name: &str| report.get(name).and_then(|v| v.as_f64()).unwrap_or(-1.0);
    assert_eq!(n("delivered"), records as f64, "{}", report.render());
    assert_eq!(n("failed outcomes"), 0.0, "{}", report.render());
    assert_eq!(n("attempts spent on 429s"), 0.0, "{}", report.render());
    report
}

#[tokio::test]
async fn pacing_smoke_delivers_everything() {
    smoke(Scenario::Pacing, 120).await;
}

#[tokio::test]
async fn storm_smoke_delivers_everything_without_spending_attempts_on_429s() {
    let report = smoke(Scenario::Storm, 20).await;
    // The target allows half the declared rate: the storm must have met 429s for the
    // smoke to mean anything.
    let throttled = report.get("429s").and_then(|v| v.as_u64()).unwrap_or(0);
    assert!(throttled > 0, "{}", report.render());
}

#[tokio::test]
async fn soak_smoke_keeps_tables_level_while_deliveries_flow() {
    let database = format!("courier_test_bench_{:08x}", rand::random::<u32>());
    let _drop = DropDatabase::new(&database);
    // 40 waves of 50 records over 10 s, with a retention of about 1.7 s (passes every
    // second).
    let records = 2_000;
    let report = bench::run(
        Scenario::Soak,
        BenchConfig {
            server_url: server_url(),
            database: database.clone(),
            records: Some(records),
            workers: None,
            out_dir: None,
            settings: settings(&server_url()),
            chaos: Default::default(),
            limits: Default::default(),
        },
    )
    .await
    .unwrap();
    let n = |name: &str| report.get(name).and_then(|v| v.as_f64()).unwrap_or(-1.0);
    let text = report.render();
    println!("{text}");
    assert_eq!(
        n("records delivered (delivered_records)"),
        records as f64,
        "{text}"
    );
    // While the feed went on, finished rows did not outlive the retention period (by more
    // than a pass and a margin): without retention, over a thousand would have.
    assert!(
        n("finished rows older than retention + 4 s, most in a sample") <= records as f64 / 20.0,
        "{text}"
    );
    // One retention period after the drain nothing finished is left; delivered_records
    // (suppression, depends_on) keeps every key.
    assert_eq!(
        n("deliveries rows one retention period after the drain"),
        0.0,
        "{text}"
    );
}

#[tokio::test]
async fn limits_smoke_runs_every_limiter_kind_and_ratio() {
    let database = format!("courier_test_bench_{:08x}", rand::random::<u32>());
    let _drop = DropDatabase::new(&database);
    let _drop_cells = DropDatabase::new(&format!("{database}_cell"));
    let report = bench::run(
        Scenario::Limits,
        BenchConfig {
            server_url: server_url(),
            database: database.clone(),
            records: Some(10),
            workers: Some(1),
            out_dir: None,
            settings: settings(&server_url()),
            chaos: Default::default(),
            limits: Default::default(),
        },
    )
    .await
    .unwrap();
    // Every cell drained (a cell that does not fails the run) and reports its figures.
    for kind in ["fixed", "sliding", "gcra", "token-bucket"] {
        for ratio in ["×1", "×2", "×5", "×10", "drop ½"] {
            let cell = format!("{kind} {ratio} 1p");
            let n = |figure: &str| {
                report
                    .get(&format!("{cell}: {figure}"))
                    .and_then(|v| v.as_f64())
                    .unwrap_or_else(|| panic!("{cell}: {figure}\n{}", report.render()))
            };
            // Ten records fit a fixed window's or a bucket's burst: below the ideal is
            // possible, nothing measures the engine here.
            assert!(n("drain ÷ ideal") > 0.0, "{cell}\n{}", report.render());
            assert!((0.0..=1.0).contains(&n("429 share")), "{cell}");
            let achieved = n("achieved ÷ real");
            assert!(
                achieved > 0.0 && achieved < 20.0,
                "{cell}\n{}",
                report.render()
            );
            for figure in ["converge to 90% (s)", "reach 90% (s)"] {
                assert!(
                    report.get(&format!("{cell}: {figure}")).is_some(),
                    "{figure}"
                );
            }
        }
    }
    assert!(!report.timeline.is_empty() && !report.real_limit.is_empty());
}

#[tokio::test]
async fn initial_sync_smoke_settles_every_record_by_its_jobs_report() {
    let database = format!("courier_test_bench_{:08x}", rand::random::<u32>());
    let _drop = DropDatabase::new(&database);
    let records = 25_000;
    let report = bench::run(
        Scenario::InitialSync,
        BenchConfig {
            server_url: server_url(),
            database: database.clone(),
            records: Some(records),
            workers: None,
            out_dir: None,
            settings: settings(&server_url()),
            chaos: Default::default(),
            limits: Default::default(),
        },
    )
    .await
    .unwrap();
    let n = |name: &str| report.get(name).and_then(|v| v.as_f64()).unwrap_or(-1.0);
    // Three jobs of up to 10,000; one profile in 1,000 refused by its job.
    assert_eq!(n("jobs"), 3.0, "{}", report.render());
    assert_eq!(n("delivered"), 24_975.0, "{}", report.render());
    assert_eq!(
        report.get("every invalid rejected, every other delivered once"),
        Some(&serde_json::Value::Bool(true)),
        "{}",
        report.render()
    );
    assert!(n("polls (target)") >= 3.0, "{}", report.render());
}
