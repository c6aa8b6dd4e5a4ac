//! The operator commands of the `courier` binary: pause and resume, retry, unblock,
//! history. Each says what it changed, and an unknown name is an error naming it.

mod common;

use common::*;

/// Runs `courier ARGS` on `url`: (success, stdout, stderr).
fn run(url: &str, args: &[&str]) -> (bool, String, String) {
    let out = courier_on(url).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn operator_commands_say_what_they_changed() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    courier::enqueue::enqueue_many(&db.pool, "customers", burst("r", 3))
        .await
        .unwrap();
    target.respond_with(422, None);
    drive(&engine).await;
    target.respond_with(200, None);

    let url = db.url.as_str();
    assert_eq!(
        run(url, &["rule", "pause", "customers"]),
        (
            true,
            "rule customers: active → paused\n".into(),
            String::new()
        )
    );
    assert_eq!(
        run(url, &["rule", "pause", "customers"]).1,
        "rule customers: already paused\n"
    );
    let (ok, out, _) = run(url, &["status", "--json"]);
    assert!(ok);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["rules"][0]["paused"], "rule");
    assert_eq!(report["rules"][0]["state"], "paused");
    let (ok, out, _) = run(url, &["status"]);
    assert!(ok && out.contains("paused"), "{out}");

    let (ok, _, err) = run(url, &["rule", "pause", "nope"]);
    assert!(!ok);
    assert!(err.contains("no rule named \"nope\""), "{err}");
    let (ok, _, err) = run(url, &["connection", "unblock", "nope"]);
    assert!(!ok);
    assert!(err.contains("no connection named \"nope\""), "{err}");

    assert_eq!(
        run(url, &["retry", "--rule", "customers"]).1,
        "rule customers: 0 exhausted deliveries made pending again\n"
    );
    let (ok, _, err) = run(
        url,
        &["retry", "--rule", "customers", "--since", "yesterday"],
    );
    assert!(!ok);
    assert!(err.contains("not a time"), "{err}");
    let (ok, out, err) = run(
        url,
        &[
            "retry",
            "--rule",
            "customers",
            "--outcome",
            "rejected",
            "--since",
            "1d",
        ],
    );
    assert!(ok, "{err}");
    assert!(
        out.starts_with("rule customers: 3 rejected deliveries ended since "),
        "{out}"
    );
    let (ok, _, err) = run(url, &["retry", "--rule", "nope"]);
    assert!(!ok && err.contains("no rule named \"nope\""), "{err}");

    // Paused: nothing is sent yet.
    assert!(drive(&engine).await.is_empty());
    assert_eq!(
        run(url, &["connection", "pause", "shop"]).1,
        "connection shop: active → paused\n"
    );
    assert_eq!(
        run(url, &["rule", "resume", "customers"]).1,
        "rule customers: paused → active\n"
    );
    assert!(drive(&engine).await.is_empty(), "the connection is paused");
    assert_eq!(
        run(url, &["connection", "resume", "shop"]).1,
        "connection shop: paused → active\n"
    );
    assert_eq!(
        run(url, &["connection", "unblock", "shop"]).1,
        "connection shop: not blocked, nothing to lift\n"
    );
    drive(&engine).await;
    assert_eq!(delivered(&db.pool).await, 3);

    let (ok, out, _) = run(url, &["history", "r:0"]);
    assert!(ok);
    let events: Vec<&str> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(4).unwrap())
        .collect();
    assert_eq!(
        events,
        ["enqueued", "rejected", "retried", "delivered"],
        "{out}"
    );
    assert!(out.contains("courier CLI ("), "{out}");
    let (ok, _, err) = run(url, &["history", "nope"]);
    assert!(!ok);
    assert!(err.contains("no delivery has record key \"nope\""), "{err}");
}

#[tokio::test]
async fn a_worker_in_steady_state_writes_one_line_per_run() {
    let (db, _target) = shop(&["customers", "orders"], 50, 4).await;
    let mut child = courier_on(&db.url)
        .arg("worker")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Several bursts, each a run or more per rule, several batches per run.
    for wave in 0..4 {
        for rule in ["customers", "orders"] {
            courier::enqueue::enqueue_many(&db.pool, rule, burst(&format!("w{wave}"), 120))
                .await
                .unwrap();
        }
        eventually("the wave is delivered", || async {
            delivered(&db.pool).await == (wave + 1) * 240
        })
        .await;
    }
    eventually("no run is active", || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM runs WHERE active")
            .fetch_one(&db.pool)
            .await
            .unwrap()
            == 0
    })
    .await;
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(child.wait().unwrap().success(), "{err}");
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let lines: Vec<&str> = err.lines().collect();
    let finished = lines.iter().filter(|l| l.contains("run finished")).count();
    assert_eq!(finished as i64, runs, "{err}");
    // Besides: worker started, stop requested, worker stopped.
    assert_eq!(lines.len() as i64, runs + 3, "{err}");
}
