//! The operator commands of the `courier` binary: pause and resume, retry, unblock,
//! history. Each says what it changed, and an unknown name is an error naming it.

use crate::common::*;

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

/// A worker process against a target that echoes every credential it is sent (a Klaviyo
/// key after its scheme, a Basic password, an OAuth token and client secret) in 422 and
/// 2xx bulk answers and a 429's `Retry-After`: none of them is in the worker's log at debug
/// level, in `courier status` (table and JSON), `courier history`, `connection list`, or
/// the dashboard's state, history and metrics; the echoes that were redacted show `***`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_echoed_by_a_target_is_in_no_log_view_or_dashboard() {
    use serde_json::json;
    const SECRETS: &[&str] = &[
        "KLAVIYOKEY-B2",
        "BASICPASSWORD99",
        "OAUTHTOKEN-5F3A",
        "CLIENTSECRET42",
    ];
    let db = TestDb::new().await;
    let tokens = Server::start("127.0.0.1", |_| {
        answer(
            "200 OK",
            "",
            r#"{"access_token": "OAUTHTOKEN-5F3A", "expires_in": 3600}"#,
        )
    })
    .await;
    let target = Server::start("127.0.0.1", |s| {
        let auth = s.header("authorization");
        let echo = json!(format!("refused for {auth} / {}", s.body)).to_string();
        match s.path.trim_matches('/') {
            "items" => {
                let n =
                    serde_json::from_str::<Vec<serde_json::Value>>(&s.body).map_or(1, |v| v.len());
                let item = format!(r#"{{"status": 422, "error": {echo}}}"#);
                answer("200 OK", "", &format!("[{}]", vec![item; n].join(",")))
            }
            "limited" => answer(
                "429 Too Many Requests",
                &format!("Retry-After: {auth}\r\n"),
                "",
            ),
            _ => answer("422 Unprocessable Entity", "", &echo),
        }
    })
    .await;
    let kinds = [
        (
            "klaviyo",
            json!({"kind": "header", "name": "Authorization", "scheme": "Klaviyo-API-Key"}),
        ),
        ("basic", json!({"kind": "basic", "user": "anystring"})),
        (
            "oauth",
            json!({"kind": "oauth", "token_url": format!("{}token", tokens.url), "client_id_env": "ECHO_CLIENT_ID"}),
        ),
    ];
    for (name, auth) in &kinds {
        for (suffix, path, per_call) in [
            ("", "items/", 2),
            ("-422", "one/", 1),
            ("-429", "limited/", 1),
        ] {
            let conn = format!("{name}{suffix}");
            courier::catalog::upsert_connection(
                &db.pool,
                &courier::catalog::NewConnection {
                    name: conn.clone(),
                    writer: "http_json".into(),
                    base_url: target.url.clone(),
                    api_key_env: Some(format!("ECHO_{}_KEY", name.to_uppercase())),
                    auth: Some(auth.clone()),
                    requests_per_minute: Some(600_000),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
            let rule = courier::catalog::NewRule {
                name: conn.clone(),
                connection: conn.clone(),
                path: path.into(),
                max_attempts: Some(1),
                records_per_call: Some(per_call),
                ..Default::default()
            };
            courier::catalog::upsert_rule(&db.pool, &rule)
                .await
                .unwrap();
            let records = (0..2).map(|i| {
                courier::enqueue::NewDelivery::new(format!("{conn}:{i}"), json!({"n": i}))
            });
            courier::enqueue::enqueue_many(&db.pool, &conn, records.collect())
                .await
                .unwrap();
        }
    }
    let log = std::env::temp_dir().join(format!("courier-echo-{}.log", std::process::id()));
    let mut worker = courier_on(&db.url)
        .arg("worker")
        .env("COURIER_HTTP_ADDR", "127.0.0.1:0")
        .env("COURIER_LOG", "debug,sqlx=warn")
        .env("ECHO_KLAVIYO_KEY", "KLAVIYOKEY-B2")
        .env("ECHO_BASIC_KEY", "BASICPASSWORD99")
        .env("ECHO_OAUTH_KEY", "CLIENTSECRET42")
        .env("ECHO_CLIENT_ID", "client-7")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
        .spawn()
        .unwrap();
    // Every record but those behind a 429 has its outcome; each 429 set its block.
    eventually("every answer met", || {
        let pool = db.pool.clone();
        async move {
            let (done, blocks): (i64, i64) = sqlx::query_as(
                "SELECT (SELECT count(*) FROM deliveries WHERE status <> 'pending'),
                        (SELECT count(*) FROM connection_blocks)",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            done == 12 && blocks == 3
        }
    })
    .await;
    let report: serde_json::Value =
        serde_json::from_str(&run(&db.url, &["status", "--json"]).1).unwrap();
    let addr = report["workers"][0]["http_addr"]
        .as_str()
        .expect("the worker's address")
        .to_owned();
    let get = |path: String| {
        let url = format!("http://{addr}{path}");
        async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
    };
    let mut shown = vec![
        get("/api/state".into()).await,
        get("/metrics".into()).await,
        run(&db.url, &["status"]).1,
        report.to_string(),
        run(&db.url, &["connection", "list"]).1,
    ];
    for (name, _) in &kinds {
        for key in [format!("{name}:0"), format!("{name}-422:1")] {
            let history = run(&db.url, &["history", &key]);
            assert!(history.0 && history.1.contains("***"), "{key}: {history:?}");
            shown.push(history.1);
            shown.push(get(format!("/api/history?key={key}")).await);
        }
    }
    worker.kill().unwrap();
    worker.wait().unwrap();
    shown.push(std::fs::read_to_string(&log).unwrap());
    shown.push(std::fs::read_to_string(log.with_extension("err")).unwrap());
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(log.with_extension("err"));
    // The log did hear the answers: a debug line per call at least.
    assert!(
        shown.last().unwrap().len() > 1_000,
        "{}",
        shown.last().unwrap()
    );
    for (i, text) in shown.iter().enumerate() {
        for secret in SECRETS {
            assert!(!text.contains(secret), "view {i} shows {secret}: {text}");
        }
    }
}
