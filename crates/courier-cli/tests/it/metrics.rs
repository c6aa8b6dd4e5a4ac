//! `/metrics` scraped from a real worker (an in-process engine with its HTTP server on an
//! ephemeral port) while it delivers into a real target: the figures move as deliveries
//! happen, a 429 shows as a block on the budget, and a database that does not answer
//! makes the scrape fail with 503 and the reason.

use std::sync::Arc;

use crate::common::*;
use courier::{enqueue, worker};
use courier_cli::web;

/// The value of the sample `series` (name with labels, as exposed), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("a number"))
}

async fn scrape(url: &str) -> String {
    let res = reqwest::get(url).await.expect("metrics answer");
    assert_eq!(res.status(), 200);
    let ct = res.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    res.text().await.unwrap()
}

#[tokio::test]
async fn metrics_move_as_a_real_worker_delivers_and_meets_a_429() {
    let (db, target) = shop(&["customers", "prices"], 50, 8).await;
    let engine = Arc::new(worker::Engine::new(db.pool.clone(), settings(&db.url)));
    let server = web::start(engine.clone(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let url = format!("http://{}/metrics", server.addr);
    let run = tokio::spawn(worker::run(engine.clone()));
    let budget: String =
        sqlx::query_scalar("SELECT courier_budget_key(c) FROM connections c WHERE name = 'shop'")
            .fetch_one(&db.pool)
            .await
            .unwrap();

    let before = scrape(&url).await;
    let delivered = r#"courier_deliveries_total{rule="customers",outcome="delivered"}"#;
    // Every family is there from the start, at zero.
    assert_eq!(sample(&before, delivered), Some(0.0), "{before}");
    assert_eq!(
        sample(&before, r#"courier_backlog_pending{rule="customers"}"#),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &before,
            r#"courier_circuit_state{connection="shop",state="closed"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &before,
            &format!(r#"courier_budget_declared_requests_per_minute{{budget="{budget}"}}"#)
        ),
        Some(600_000.0)
    );

    enqueue::enqueue_many(&db.pool, "customers", burst("customer", 120))
        .await
        .unwrap();
    let pool = db.pool.clone();
    eventually("120 delivered, no run active", || {
        let pool = pool.clone();
        async move {
            let (n, active): (i64, i64) = sqlx::query_as(
                "SELECT (SELECT count(*) FROM deliveries WHERE status = 'delivered'),
                        (SELECT count(*) FROM runs WHERE active)",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            n == 120 && active == 0
        }
    })
    .await;
    let after = scrape(&url).await;
    assert_eq!(sample(&after, delivered), Some(120.0), "{after}");
    assert_eq!(
        sample(
            &after,
            r#"courier_calls_total{connection="shop",class="2xx"}"#
        ),
        Some(120.0)
    );
    assert_eq!(
        sample(
            &after,
            r#"courier_delivery_latency_seconds_count{rule="customers"}"#
        ),
        Some(120.0)
    );
    assert_eq!(
        sample(
            &after,
            &format!(r#"courier_pacer_wait_seconds_count{{budget="{budget}"}}"#)
        ),
        Some(120.0)
    );
    assert!(sample(&after, r#"courier_runs{status="completed"}"#).unwrap() >= 1.0);
    assert_eq!(
        sample(&after, r#"courier_runs{status="running"}"#),
        Some(0.0)
    );
    // No record key or payload appears anywhere.
    assert!(!after.contains("customer:"), "{after}");

    // The target says 429 with a wait: the budget is blocked, the backlog stays.
    target.respond_with(429, Some("60"));
    enqueue::enqueue_many(&db.pool, "prices", burst("price", 7))
        .await
        .unwrap();
    let limited = format!(r#"courier_rate_limited_total{{budget="{budget}"}}"#);
    let mut text = String::new();
    for _ in 0..200 {
        text = scrape(&url).await;
        // The gauges are read before the counters are encoded: wait for both.
        let remaining = format!(r#"courier_block_remaining_seconds{{budget="{budget}"}}"#);
        if sample(
            &text,
            &format!(r#"courier_blocks_set_total{{budget="{budget}"}}"#),
        )
        .is_some()
            && sample(&text, &remaining).is_some_and(|s| s > 0.0)
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(sample(&text, &limited).unwrap() >= 1.0, "{text}");
    let left = sample(
        &text,
        &format!(r#"courier_block_remaining_seconds{{budget="{budget}"}}"#),
    )
    .unwrap();
    let blocks: Vec<(String, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT budget_key, blocked_until FROM connection_blocks")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert!(
        left > 50.0 && left <= 61.0,
        "{left} {blocks:?} {}\n{text}",
        chrono::Utc::now()
    );
    assert_eq!(
        sample(&text, r#"courier_backlog_pending{rule="prices"}"#),
        Some(7.0)
    );
    assert!(
        sample(
            &text,
            r#"courier_calls_total{connection="shop",class="4xx"}"#
        )
        .unwrap()
            >= 1.0
    );
    // This process slowed down after the 429.
    let effective = sample(
        &text,
        &format!(r#"courier_budget_effective_requests_per_minute{{budget="{budget}"}}"#),
    )
    .unwrap();
    assert!(effective < 600_000.0, "{effective}");
    // A 429 is no outcome of the record.
    assert_eq!(
        sample(
            &text,
            r#"courier_deliveries_total{rule="prices",outcome="failed"}"#
        ),
        Some(0.0)
    );

    engine.shutdown.cancel();
    run.await.unwrap().unwrap();
    server.task.await.unwrap();
}

/// Every metric name the shipped alert rules use (`deploy/prometheus/courier.rules.yml`).
fn alert_metrics() -> std::collections::BTreeSet<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/prometheus/courier.rules.yml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut names = std::collections::BTreeSet::new();
    for (i, _) in text.match_indices("courier_") {
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        names.insert(name);
    }
    names
}

/// An idle worker serves every family from the start, at zero for the rules, connections
/// and budgets it knows (a rule's own budget and a job's poll budget among them), so an
/// alert has a series to compare before the first event; every metric the shipped alert
/// rules name is one it serves; and the dashboard's figures are the scrape's.
#[tokio::test]
async fn every_family_is_served_from_the_start_and_every_alert_names_one() {
    let (db, _target) = shop(&["customers"], 50, 8).await;
    sqlx::query(
        "UPDATE rules SET budget_key = 'shop:customers', limits = '{5/s}',
                          job = '{\"id\": \"/id\", \"poll\": {\"path\": \"jobs/{id}\", \"status\": \"/state\",
                                  \"complete\": [\"done\"], \"failed\": []},
                                  \"poll_budget\": {\"key\": \"shop:polls\", \"limits\": [\"1/s\"]}}',
                          records_per_call = 10",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let engine = Arc::new(worker::Engine::new(db.pool.clone(), settings(&db.url)));
    let server = web::start(engine.clone(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let text = scrape(&format!("http://{}/metrics", server.addr)).await;
    let served: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    for series in [
        r#"courier_deliveries_total{rule="customers",outcome="exhausted"}"#,
        r#"courier_deliveries_total{rule="customers",outcome="accepted"}"#,
        r#"courier_calls_total{connection="shop",class="5xx"}"#,
        r#"courier_rate_limited_total{budget="shop:customers"}"#,
        r#"courier_blocks_set_total{budget="shop:polls"}"#,
        r#"courier_calls_split_total{rule="customers"}"#,
        r#"courier_delivery_latency_seconds_count{rule="customers"}"#,
        r#"courier_pacer_wait_seconds_count{budget="shop:customers"}"#,
        r#"courier_jobs_in_flight{rule="customers"}"#,
        r#"courier_jobs_overdue{rule="customers"}"#,
        r#"courier_rule_unusable{rule="customers"}"#,
        r#"courier_block_remaining_seconds{budget="shop:polls"}"#,
        r#"courier_budget_calls_last_minute{budget="shop:customers"}"#,
        r#"courier_erasure_answers_total{outcome="failed"}"#,
        r#"courier_erasure_targets{outcome="pending"}"#,
        "courier_erasures_open",
        "courier_erasure_oldest_open_seconds",
    ] {
        assert_eq!(sample(&text, series), Some(0.0), "{series} in\n{text}");
    }
    // The rule's own budget at its own limit (5/s), the poll budget at its own (1/s).
    for (budget, rpm) in [("shop:customers", 300.0), ("shop:polls", 60.0)] {
        let series = format!(r#"courier_budget_declared_requests_per_minute{{budget="{budget}"}}"#);
        assert_eq!(sample(&text, &series), Some(rpm), "{series}");
    }
    assert_eq!(
        sample(&text, "courier_workers_live"),
        Some(0.0),
        "no worker beats yet"
    );
    for name in alert_metrics() {
        assert!(
            served.contains(name.as_str()),
            "the alert rules name {name}, which /metrics does not serve:\n{text}"
        );
    }
    // The dashboard reads the same figures.
    let state: serde_json::Value = reqwest::get(format!("http://{}/api/state", server.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for b in state["budgets"].as_array().unwrap() {
        let key = b["key"].as_str().unwrap();
        let effective =
            format!(r#"courier_budget_effective_requests_per_minute{{budget="{key}"}}"#);
        assert_eq!(
            sample(&text, &effective),
            b["effective_rpm"].as_f64(),
            "{key}"
        );
        let used = format!(r#"courier_budget_calls_last_minute{{budget="{key}"}}"#);
        assert_eq!(
            sample(&text, &used),
            b["used_last_minute"].as_f64(),
            "{key}"
        );
    }
    assert_eq!(state["budgets"].as_array().unwrap().len(), 3, "{state}");
    engine.shutdown.cancel();
    server.task.await.unwrap();
}

#[tokio::test]
async fn a_scrape_the_database_cannot_answer_is_a_503_with_the_reason() {
    let db = TestDb::new().await;
    // A pool on a database that does not exist: every statement fails.
    let missing = database_url(&format!(
        "courier_test_missing_{:016x}",
        rand::random::<u64>()
    ));
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect_lazy(&missing)
        .unwrap();
    let engine = Arc::new(worker::Engine::new(pool, settings(&db.url)));
    let server = web::start(engine.clone(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let res = reqwest::get(format!("http://{}/metrics", server.addr))
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    let body = res.text().await.unwrap();
    assert!(body.contains("reading the database for metrics"), "{body}");
    engine.shutdown.cancel();
    server.task.await.unwrap();
}

#[tokio::test]
async fn a_busy_address_is_an_error_naming_it() {
    let db = TestDb::new().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let engine = Arc::new(worker::Engine::new(db.pool.clone(), settings(&db.url)));
    let err = web::start(engine, addr).await.unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains(&addr.to_string()), "{text}");
    assert!(text.contains("COURIER_HTTP_ADDR"), "{text}");
}

/// The binary: `courier worker` serves on `COURIER_HTTP_ADDR`, and refuses to start,
/// naming the address, when another process holds it.
#[tokio::test]
async fn the_worker_binary_serves_metrics_and_names_a_busy_address() {
    let db = TestDb::new().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().to_string();
    let out = courier_on(&db.url)
        .arg("worker")
        .env("COURIER_HTTP_ADDR", &busy)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&busy) && err.contains("COURIER_HTTP_ADDR"),
        "{err}"
    );
    drop(taken);

    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let mut child = courier_on(&db.url)
        .arg("worker")
        .env("COURIER_HTTP_ADDR", &free)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut text = None;
    for _ in 0..200 {
        if let Ok(res) = reqwest::get(format!("http://{free}/metrics")).await {
            text = Some(res.text().await.unwrap());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    let text = text.expect("the worker serves /metrics");
    assert!(text.contains("# TYPE courier_runs gauge"), "{text}");
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    assert!(status.success(), "{status}");
}
