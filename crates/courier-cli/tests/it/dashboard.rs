//! The dashboard in a real headless browser: a worker with its HTTP server delivers a burst
//! into a real target, meets a 429 that blocks the budget, and Chromium (Debian's package,
//! `scripts/install-chromium`) loads the page, runs its script, and the DOM it leaves
//! shows the connection, the block with its end and the rule that met it, and the rules'
//! backlog. Skipped, saying so, when no Chromium is installed.
//!
//! `COURIER_DASHBOARD_SCREENSHOT=docs/dashboard.png` also saves a screenshot there (how the
//! README's picture is made); `COURIER_DASHBOARD_JOBS_SCREENSHOT=docs/dashboard-jobs.png`
//! the Klaviyo shop's (docs/operating.md).

use std::{path::PathBuf, process::Command, sync::Arc};

use crate::common::*;
use courier::{enqueue, worker};
use courier_cli::web;

fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Runs headless Chromium on `url` with `args`; returns stdout.
fn browse(exe: &PathBuf, profile: &std::path::Path, args: &[&str], url: &str) -> String {
    let out = Command::new(exe)
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_connection_block_and_backlog_in_a_real_browser() {
    let Some(exe) = chromium() else {
        eprintln!(
            "SKIPPED the_dashboard_shows_connection_block_and_backlog_in_a_real_browser: no \
             Chromium at /usr/bin/chromium (run scripts/install-chromium)"
        );
        return;
    };
    let (db, target) = shop(&["customers", "prices"], 20, 4).await;
    // A paced connection, so the chart has a shape: 20 requests per second.
    sqlx::query("UPDATE connections SET requests_per_minute = 1200")
        .execute(&db.pool)
        .await
        .unwrap();
    let engine = Arc::new(worker::Engine::new(db.pool.clone(), settings(&db.url)));
    let server = web::start(engine.clone(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let run = tokio::spawn(worker::run(engine.clone()));

    // The README's screenshot is taken after a longer burst, for a chart with a plateau.
    let keep = std::env::var("COURIER_DASHBOARD_SCREENSHOT").ok();
    let n = if keep.is_some() { 700 } else { 80 };
    enqueue::enqueue_many(&db.pool, "customers", burst("customer", n))
        .await
        .unwrap();
    let pool = db.pool.clone();
    eventually("the burst delivered", || {
        let pool = pool.clone();
        async move { delivered(&pool).await == n as i64 }
    })
    .await;
    // Now the target refuses with a wait far longer than the test: the budget is blocked.
    target.respond_with(429, Some("240"));
    enqueue::enqueue_many(&db.pool, "prices", burst("price", 9))
        .await
        .unwrap();
    enqueue::enqueue_many(&db.pool, "customers", burst("late", 4))
        .await
        .unwrap();
    let pool = db.pool.clone();
    // Settled: the block written and no run still calling (a later 429 could move it).
    eventually("the budget blocked and every run waiting", || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM connection_blocks WHERE blocked_until > now())
                    AND NOT EXISTS (SELECT 1 FROM runs WHERE status = 'running')",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    })
    .await;
    let (until, rule, raw): (chrono::DateTime<chrono::Utc>, String, String) = sqlx::query_as(
        "SELECT b.blocked_until, r.name, b.retry_after_raw
         FROM connection_blocks b JOIN rules r ON r.id = b.rule_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(raw, "240");

    let profile =
        std::env::temp_dir().join(format!("courier-chromium-{:016x}", rand::random::<u64>()));
    let url = format!("http://{}/", server.addr);
    let dom = {
        let (exe, profile, url) = (exe.clone(), profile.clone(), url.clone());
        tokio::task::spawn_blocking(move || browse(&exe, &profile, &["--dump-dom"], &url))
            .await
            .unwrap()
    };
    // The script ran and redrew the page from /api/state at least once.
    let refreshes: u32 = dom
        .split("data-refreshes=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no refresh counter in the DOM:\n{dom}"));
    assert!(refreshes >= 1, "the script never redrew the page:\n{dom}");
    let section = |id: &str| section(&dom, id);
    let connections = section("connections");
    assert!(connections.contains("<td>shop</td>"), "{connections}");
    let budgets = section("budgets");
    assert!(
        budgets.contains("<td>connection:1</td><td>shop</td><td>connection</td>"),
        "{budgets}"
    );
    assert!(
        budgets.contains("data-budget=\"connection:1\"") && budgets.contains("<polyline"),
        "the busy budget's chart was not drawn: {budgets}"
    );
    let blocks = section("blocks");
    let until_text = until.format("%Y-%m-%d %H:%M:%S UTC").to_string();
    assert!(
        blocks.contains(&format!("<td>{until_text}</td>")),
        "{until_text} not in {blocks}"
    );
    assert!(blocks.contains(&format!("<td>{rule}</td>")), "{blocks}");
    assert!(blocks.contains("<td>240</td>"), "{blocks}");
    // Each rule's backlog: pending counts as the database has them.
    let rules = section("rules");
    for (name, pending) in [("prices", 9), ("customers", 4)] {
        let row = format!(
            "<td>{name}</td><td>shop</td><td>connection:1</td><td>1</td><td>{pending}</td>"
        );
        assert!(rules.contains(&row), "{row} not in {rules}");
    }
    assert!(section("runs").contains("<td>customers</td>"));

    let shot = profile.join("dashboard.png");
    {
        let (exe, profile, url, arg) = (
            exe.clone(),
            profile.clone(),
            url.clone(),
            format!("--screenshot={}", shot.display()),
        );
        tokio::task::spawn_blocking(move || {
            browse(&exe, &profile, &[&arg, "--window-size=1280,1100"], &url)
        })
        .await
        .unwrap();
    }
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    if let Some(keep) = keep {
        std::fs::write(&keep, &png).unwrap();
        eprintln!("screenshot saved to {keep}");
    }
    let _ = std::fs::remove_dir_all(&profile);

    engine.shutdown.cancel();
    run.await.unwrap().unwrap();
    server.task.await.unwrap();
}

/// POSTs `path` with `token` as the bearer token (none: no header); status and body.
async fn post(base: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let client = reqwest::Client::new();
    let mut req = client.post(format!("{base}{path}"));
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let res = req.send().await.unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

async fn flag(pool: &sqlx::PgPool, sql: &'static str) -> bool {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test]
async fn actions_need_the_token_and_call_the_operations() {
    let (db, _target) = shop(&["customers"], 20, 4).await;
    // Read-only: no token configured, every action is refused.
    let engine = Arc::new(worker::Engine::new(db.pool.clone(), settings(&db.url)));
    let server = web::start(engine.clone(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let base = format!("http://{}", server.addr);
    let (code, body) = post(&base, "/api/rules/customers/pause", Some("anything")).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("COURIER_HTTP_TOKEN"));
    assert!(
        !flag(
            &db.pool,
            "SELECT paused FROM rules WHERE name = 'customers'"
        )
        .await
    );
    // A GET never acts.
    let res = reqwest::get(format!("{base}/api/rules/customers/pause"))
        .await
        .unwrap();
    assert_eq!(res.status(), 405);
    engine.shutdown.cancel();
    server.task.await.unwrap();

    let mut settings = settings(&db.url);
    settings.http_token = Some(courier::config::HttpToken::new("t0ken-s3cret"));
    let engine = Arc::new(worker::Engine::new(db.pool.clone(), settings));
    let server = web::start(engine.clone(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let base = format!("http://{}", server.addr);
    for token in [None, Some("wrong-guess"), Some("t0ken-s3cre")] {
        let (code, body) = post(&base, "/api/rules/customers/pause", token).await;
        assert_eq!(code, 401, "{body}");
        assert!(
            !body.contains("wrong-guess") && !body.contains("s3cre"),
            "{body}"
        );
    }
    assert!(
        !flag(
            &db.pool,
            "SELECT paused FROM rules WHERE name = 'customers'"
        )
        .await
    );
    let ok = Some("t0ken-s3cret");
    let (code, body) = post(&base, "/api/rules/customers/pause", ok).await;
    assert_eq!(
        (code, body.trim()),
        (200, "rule customers: active → paused")
    );
    assert!(
        flag(
            &db.pool,
            "SELECT paused FROM rules WHERE name = 'customers'"
        )
        .await
    );
    let (code, body) = post(&base, "/api/rules/customers/resume", ok).await;
    assert_eq!(
        (code, body.trim()),
        (200, "rule customers: paused → active")
    );
    let (code, body) = post(&base, "/api/connections/shop/pause", ok).await;
    assert_eq!(
        (code, body.trim()),
        (200, "connection shop: active → paused")
    );
    assert!(
        flag(
            &db.pool,
            "SELECT paused FROM connections WHERE name = 'shop'"
        )
        .await
    );
    let (code, _) = post(&base, "/api/connections/shop/resume", ok).await;
    assert_eq!(code, 200);
    assert!(
        !flag(
            &db.pool,
            "SELECT paused FROM connections WHERE name = 'shop'"
        )
        .await
    );
    let (code, body) = post(&base, "/api/rules/nope/pause", ok).await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("nope"));

    // Lift a block.
    sqlx::query(
        "INSERT INTO connection_blocks (budget_key, blocked_until, connection_id, retry_after_raw, set_at)
         SELECT courier_budget_key(c), now() + interval '1 hour', c.id, '3600', now()
         FROM connections c WHERE name = 'shop'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let (code, body) = post(&base, "/api/connections/shop/unblock", ok).await;
    assert_eq!((code, body.trim()), (200, "connection shop: block lifted"));
    assert!(!flag(&db.pool, "SELECT EXISTS (SELECT 1 FROM connection_blocks)").await);

    // Retry exhausted deliveries, named in the ledger as the dashboard's.
    enqueue::enqueue_many(&db.pool, "customers", burst("customer", 3))
        .await
        .unwrap();
    sqlx::query(
        "UPDATE deliveries SET status = 'exhausted', attempts = 3 WHERE record_key <> 'customer:2'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let (code, body) = post(&base, "/api/rules/customers/retry?outcome=bogus", ok).await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = post(&base, "/api/rules/customers/retry?outcome=exhausted", ok).await;
    assert_eq!(
        (code, body.trim()),
        (
            200,
            "rule customers: 2 exhausted deliveries made pending again"
        )
    );
    assert!(
        flag(
            &db.pool,
            "SELECT count(*) = 3 FROM deliveries WHERE status = 'pending' AND attempts = 0"
        )
        .await
    );

    // The history of one record, as JSON and on the page.
    let h: serde_json::Value = reqwest::get(format!("{base}/api/history?key=customer:1"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let lines = h["lines"].as_array().unwrap();
    assert_eq!(lines[0]["outcome"], serde_json::Value::Null, "{h}");
    assert_eq!(lines[1]["outcome"], "retried", "{h}");
    assert_eq!(lines[1]["detail"], web::ACTOR, "{h}");
    let page = reqwest::get(format!("{base}/?key=customer:1"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("<td>retried</td>"), "{page}");
    assert!(page.contains("data-actions=\"true\""));
    assert!(!page.contains("t0ken-s3cret"));
    // In a browser, the script offers the actions (no token in the page).
    if let Some(exe) = chromium() {
        let profile =
            std::env::temp_dir().join(format!("courier-chromium-{:016x}", rand::random::<u64>()));
        let url = format!("{base}/?key=customer:1");
        // A 1300 px wide window: every table, the rules' action buttons included, fits.
        let dom = {
            let profile = profile.clone();
            let args = ["--dump-dom", "--window-size=1300,1000"];
            tokio::task::spawn_blocking(move || browse(&exe, &profile, &args, &url))
                .await
                .unwrap()
        };
        let _ = std::fs::remove_dir_all(&profile);
        assert!(!dom.contains("data-refreshes=\"0\""), "{dom}");
        assert!(
            dom.contains("data-fits=\"true\""),
            "cut off at 1300 px: {dom}"
        );
        for button in [
            "lift block",
            "retry exhausted",
            "retry rejected",
            "pause",
            "resume",
        ] {
            assert!(
                dom.contains(&format!(">{button}</button>")),
                "{button}: {dom}"
            );
        }
        assert!(dom.contains("id=\"token\""), "{dom}");
        assert!(dom.contains("<td>retried</td>"), "{dom}");
        assert!(!dom.contains("t0ken-s3cret"));
    }
    engine.shutdown.cancel();
    server.task.await.unwrap();
}

/// Loads `url` in headless Chromium and returns the DOM the script leaves, after at least
/// one redraw from `/api/state`.
async fn dom_of(exe: &std::path::Path, url: &str) -> String {
    let profile =
        std::env::temp_dir().join(format!("courier-chromium-{:016x}", rand::random::<u64>()));
    let (exe, profile2, url) = (exe.to_path_buf(), profile.clone(), url.to_owned());
    let dom = tokio::task::spawn_blocking(move || browse(&exe, &profile2, &["--dump-dom"], &url))
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        !dom.contains("data-refreshes=\"0\""),
        "the script never redrew the page:\n{dom}"
    );
    dom
}

/// A section of the page, by id.
fn section(dom: &str, id: &str) -> String {
    let start = dom
        .find(&format!("<section id=\"{id}\""))
        .unwrap_or_else(|| panic!("no section {id}:\n{dom}"));
    let end = dom[start..].find("</section>").unwrap() + start;
    dom[start..end].to_owned()
}

/// The Klaviyo preset's bulk import (a job rule on a budget of its own, polled on another)
/// and its events rule (a budget of its own) through a real worker into `courier target`'s
/// Klaviyo: the page in Chromium shows each budget's row with its rules and a chart of each
/// busy one, the job that ended with what it reported, the run that handed it the records,
/// and the rules' delivered totals counting what the job reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_every_budget_and_the_targets_jobs_in_a_real_browser() {
    let Some(exe) = chromium() else {
        eprintln!(
            "SKIPPED the_dashboard_shows_every_budget_and_the_targets_jobs_in_a_real_browser: \
             no Chromium at /usr/bin/chromium (run scripts/install-chromium)"
        );
        return;
    };
    let db = TestDb::new().await;
    let target = courier_target::Target::start(0).await.unwrap();
    let preset = courier::presets::find("klaviyo").unwrap();
    let mut file = preset_rule(preset, "klaviyo-profiles-bulk", &target.url());
    let events = preset_rule(preset, "klaviyo-events", &target.url());
    file["rules"]
        .as_array_mut()
        .unwrap()
        .push(events["rules"][0].clone());
    courier::apply::apply_file(&db.pool, &file.to_string(), Default::default())
        .await
        .unwrap();
    let profiles = (0..300).map(|i| {
        let p = serde_json::json!({"email": format!("p{i}@example.com")});
        enqueue::NewDelivery::new(format!("profile:{i}"), p)
    });
    enqueue::enqueue_many(&db.pool, "klaviyo-profiles-bulk", profiles.collect())
        .await
        .unwrap();
    let events = (0..40).map(|i| {
        let p = serde_json::json!({"email": format!("p{i}@example.com"), "metric": "Placed Order",
                                   "properties": {"value": i}});
        enqueue::NewDelivery::new(format!("event:{i}"), p)
    });
    enqueue::enqueue_many(&db.pool, "klaviyo-events", events.collect())
        .await
        .unwrap();
    let engine = Arc::new(worker::Engine::new(db.pool.clone(), settings(&db.url)));
    let server = web::start(engine.clone(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let run = tokio::spawn(worker::run(engine.clone()));
    let pool = db.pool.clone();
    eventually("every record delivered, the job reported", || {
        let pool = pool.clone();
        async move { delivered(&pool).await == 340 }
    })
    .await;
    // A person asked to be forgotten; this worker has no erasure key, so it stays open.
    let person = courier::erasure::Person {
        email: Some("p1@example.com".into()),
        ..Default::default()
    };
    let erasure = courier::erasure::request(&db.pool, &person, "the dashboard test")
        .await
        .unwrap();
    let url = format!("http://{}/", server.addr);
    let dom = dom_of(&exe, &url).await;
    let erasures = section(&dom, "erasures");
    assert!(
        erasures.contains(&format!("<td>{erasure}</td>"))
            && erasures.contains("<td>the dashboard test</td>")
            && erasures.contains("klaviyo: pending"),
        "the open erasure and its connection's part: {erasures}"
    );
    assert!(
        !erasures.contains("p1@example.com"),
        "never the person: {erasures}"
    );
    let budgets = section(&dom, "budgets");
    for row in [
        "<td>klaviyo:events</td><td>klaviyo</td><td>rule</td>",
        "<td>klaviyo:profile-bulk-import-jobs</td><td>klaviyo</td><td>rule</td>",
        "<td>klaviyo:profile-bulk-import-jobs:read</td><td>klaviyo</td><td>polls</td>",
    ] {
        assert!(budgets.contains(row), "{row} not in {budgets}");
    }
    assert!(
        budgets.contains("<td>klaviyo-profiles-bulk (polls)</td>"),
        "{budgets}"
    );
    // The events budget was called: its row counts the calls, and it has a chart.
    assert!(
        budgets.contains("data-budget=\"klaviyo:events\""),
        "{budgets}"
    );
    let jobs = section(&dom, "jobs");
    assert!(
        jobs.contains("<td>klaviyo-profiles-bulk</td>")
            && jobs.contains("<td>complete</td><td>300</td><td>300</td><td>0</td><td>0</td>"),
        "the ended job and what it reported: {jobs}"
    );
    let runs = section(&dom, "runs");
    assert!(
        runs.contains("<td>klaviyo-profiles-bulk</td><td>completed</td><td>300</td><td>300</td>"),
        "the run that handed the job its records, with what the job reported: {runs}"
    );
    let rules = section(&dom, "rules");
    assert!(
        rules.contains("<td>klaviyo:profile-bulk-import-jobs</td>"),
        "a rule's row names its budget: {rules}"
    );
    if let Ok(keep) = std::env::var("COURIER_DASHBOARD_JOBS_SCREENSHOT") {
        let profile =
            std::env::temp_dir().join(format!("courier-chromium-{:016x}", rand::random::<u64>()));
        let shot = profile.join("dashboard.png");
        let arg = format!("--screenshot={}", shot.display());
        let (exe, p2) = (exe.clone(), profile.clone());
        tokio::task::spawn_blocking(move || {
            browse(&exe, &p2, &[&arg, "--window-size=1280,1500"], &url)
        })
        .await
        .unwrap();
        std::fs::copy(&shot, &keep).unwrap();
        let _ = std::fs::remove_dir_all(&profile);
    }
    engine.shutdown.cancel();
    run.await.unwrap().unwrap();
    server.task.await.unwrap();
}
