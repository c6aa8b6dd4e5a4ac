//! The `courier` binary itself: its input handling, its exit codes and its reports, run
//! as a child process against a database of its own.

use crate::common::*;
use courier::enqueue::{self, NewDelivery};
use serde_json::json;

#[tokio::test]
async fn enqueue_rejects_bad_input_whole() {
    let (db, _target) = shop(&["customers"], 10, 1).await;

    let input =
        "{\"record_key\":\"a\",\"payload\":{}}\n{\"record_key\":\"b\",\"payload\":{}}\n{oops\n";
    let dir = std::env::temp_dir().join(format!("courier-ndjson-{}", rand::random::<u32>()));
    std::fs::write(&dir, input).unwrap();
    let out = courier_on(&db.url)
        .args(["enqueue", "--rule", "customers", "--file"])
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("line 3"), "{stderr}");

    let good = "{\"record_key\":\"a\",\"payload\":{}}\n";
    std::fs::write(&dir, good).unwrap();
    let out = courier_on(&db.url)
        .args(["enqueue", "--rule", "unknown-rule", "--file"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown-rule"));
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM deliveries")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(n, 0, "nothing from a refused input is inserted");

    let out = courier_on(&db.url)
        .args(["enqueue", "--rule", "customers", "--file"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM deliveries")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
    let _ = std::fs::remove_file(&dir);
}

#[test]
fn bad_config_is_refused_naming_the_setting() {
    let out = courier()
        .arg("status")
        .env("COURIER_BREAKER_COOLDOWN_SECONDS", "soon")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("COURIER_BREAKER_COOLDOWN_SECONDS"),
        "{stderr}"
    );
}

#[test]
fn help_needs_no_valid_settings() {
    let out = courier()
        .arg("--help")
        .env("COURIER_WORKER_CONCURRENCY", "abc")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage"));
}

#[test]
fn the_installed_binary_carries_no_benchmark_harness() {
    let help = ran(courier().arg("--help"));
    assert!(help.ok && !help.stdout.contains("bench"), "{}", help.both());
    let bench = ran(courier().args(["bench", "pacing"]));
    assert_eq!(
        bench.code,
        Some(2),
        "an unknown subcommand: {}",
        bench.both()
    );
}

#[test]
fn the_worker_refuses_a_wait_bound_beyond_the_staleness_window() {
    let out = courier()
        .arg("worker")
        .env("COURIER_THROTTLE_MAX_WAIT_SECONDS", "900")
        .env("COURIER_CHAIN_STALE_AFTER_SECONDS", "600")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("COURIER_THROTTLE_MAX_WAIT_SECONDS")
            && stderr.contains("COURIER_CHAIN_STALE_AFTER_SECONDS"),
        "{stderr}"
    );
}

#[tokio::test]
async fn status_reports_connections_rules_and_runs_as_json() {
    let (db, _target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    drive(&engine).await;
    enqueue::enqueue(&db.pool, "customers", NewDelivery::new("c:9", json!({})))
        .await
        .unwrap();
    let out = courier_on(&db.url)
        .args(["status", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["connections"][0]["circuit"], "closed");
    assert_eq!(report["rules"][0]["name"], "customers");
    assert_eq!(report["rules"][0]["pending"], 1);
    assert_eq!(report["recent_runs"][0]["status"], "completed");
    assert_eq!(report["recent_runs"][0]["delivered"], 3);
    let table = courier_on(&db.url).arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("CONNECTIONS") && text.contains("customers") && text.contains("completed"),
        "{text}"
    );
}

/// Whether the server has a database by that name.
async fn exists(name: &str) -> bool {
    let admin = sqlx::PgPool::connect(&server_url()).await.unwrap();
    let found = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(name)
        .fetch_one(&admin)
        .await
        .unwrap();
    admin.close().await;
    found
}

#[tokio::test]
async fn only_db_create_creates_the_database() {
    let name = format!("courier_test_{:016x}", rand::random::<u64>());
    let url = database_url(&name);
    let _drop = DropDatabase::new(&name);

    // Ordinary commands connect to DATABASE_URL only: a missing database is an error
    // that names the way out, and none of them creates it.
    for args in [
        &["migrate"][..],
        &["worker"],
        &["status"],
        &["rule", "list"],
        &["connection", "list"],
    ] {
        let out = courier_on(&url).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&name) && stderr.contains("courier db create"),
            "{args:?}: {stderr}"
        );
    }
    assert!(!exists(&name).await);

    let out = courier_on(&url).args(["db", "create"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("database created"));
    assert!(exists(&name).await);
    let again = courier_on(&url).args(["db", "create"]).output().unwrap();
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("exists already"));

    for args in [&["migrate"][..], &["status"]] {
        let out = courier_on(&url).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
