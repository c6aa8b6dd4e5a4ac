//! The command line refuses mistakes at the door, naming what is wrong: rule paths its
//! connection's writer cannot serve, bad headers and base URLs, blank record keys and
//! self-dependencies, unknown variables and an invalid log filter, and a database that
//! never answers.

use std::time::{Duration, Instant};

use crate::common::*;

/// Runs the binary on `url` with `args`; returns (success, stderr).
fn run(url: &str, args: &[&str]) -> (bool, String) {
    let r = run_on(url, args);
    (r.ok, r.stderr)
}

/// Like [`run`], with standard output and standard error together.
fn both(url: &str, args: &[&str]) -> (bool, String) {
    let r = run_on(url, args);
    (r.ok, r.both())
}

fn temp_file(contents: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("courier-door-{:016x}", rand::random::<u64>()));
    std::fs::write(&path, contents).unwrap();
    path
}

#[tokio::test]
async fn usercom_is_a_preset_and_rule_add_and_apply_refuse_a_path_that_does_not_read() {
    let db = TestDb::new().await;
    let uc = [
        "connection",
        "add",
        "--name",
        "uc",
        "--base-url",
        "https://shop.user.com/api/public/",
        "--api-key-env",
        "SHOP_USERCOM_KEY",
    ];
    // The writer of an older courier is refused, naming the preset that replaced it.
    let (ok, err) = run(&db.url, &[&uc[..], &["--writer", "usercom"]].concat());
    assert!(!ok);
    assert!(err.contains("courier apply --preset usercom"), "{err}");
    let (ok, err) = run(&db.url, &[&uc[..], &["--preset", "usercom"]].concat());
    assert!(ok, "{err}");
    let (ok, err) = run(
        &db.url,
        &[
            "rule",
            "add",
            "--preset",
            "usercom/usercom-users",
            "--name",
            "customers",
            "--connection",
            "uc",
            "--path",
            "users/{payload.custom_id}/",
        ],
    );
    assert!(!ok);
    assert!(
        err.contains("\"customers\"") && err.contains("unknown placeholder {{payload.custom_id}}"),
        "{err}"
    );
    let file = temp_file(
        r#"{"rules": [{"name": "customers", "connection": "uc", "path": "users/update_or_create/"},
                      {"name": "orders", "connection": "uc", "path": "deals/{custom_id/"}]}"#,
    );
    let (ok, err) = run(&db.url, &["apply", file.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("\"orders\"") && err.contains("without its }"),
        "{err}"
    );
    let rules: i64 = sqlx::query_scalar("SELECT count(*) FROM rules")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rules, 0, "the file is applied whole or not at all");
    let (ok, err) = run(
        &db.url,
        &[
            "rule",
            "add",
            "--preset",
            "usercom/usercom-attributes",
            "--name",
            "consents",
            "--connection",
            "uc",
        ],
    );
    assert!(ok, "{err}");
    let (request, per_call): (serde_json::Value, i32) =
        sqlx::query_as("SELECT request, records_per_call FROM rules WHERE name = 'consents'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(per_call, 100);
    assert_eq!(request["group"]["method"], "PUT");
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn connection_add_and_apply_refuse_bad_headers_and_base_urls_naming_the_field() {
    let db = TestDb::new().await;
    let add = |extra: &[&str]| {
        let mut args = vec!["connection", "add", "--name", "crm"];
        args.extend_from_slice(extra);
        run(&db.url, &args)
    };
    let url = ["--base-url", "https://crm.example.com/api/"];
    for (args, expected) in [
        (
            vec!["--base-url", "http://"],
            &["\"crm\"", "base_url", "host"][..],
        ),
        (
            vec!["--base-url", "http://exa mple/"],
            &["\"crm\"", "base_url", "blank"],
        ),
        (
            vec![
                url[0],
                url[1],
                "--header",
                "X-Api-Key: SECRET123\nX-Injected: 1",
            ],
            &["\"crm\"", "header \"X-Api-Key\"", "line break"],
        ),
        (
            vec![url[0], url[1], "--header", "Bearer SECRET123"],
            &["\"crm\"", "--header number 1", "Name: value"],
        ),
        (
            vec![url[0], url[1], "--header", "X Tenant: shop"],
            &["\"crm\"", "header name \"X Tenant\""],
        ),
    ] {
        let (ok, err) = add(&args);
        assert!(!ok, "{args:?} was accepted");
        for e in expected {
            assert!(err.contains(e), "{args:?}: {err:?} should say {e:?}");
        }
        assert!(!err.contains("SECRET123"), "{err}");
    }
    let file = temp_file(
        r#"{"connections": [{"name": "crm", "writer": "http_json",
                             "base_url": "https://crm.example.com/api/",
                             "headers": {"X-Tenant": "shop\r\nX-Injected: 1"}}]}"#,
    );
    let (ok, err) = run(&db.url, &["apply", file.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("header \"X-Tenant\"") && err.contains("line break"),
        "{err}"
    );
    let connections: i64 = sqlx::query_scalar("SELECT count(*) FROM connections")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(connections, 0);
    let (ok, err) = add(&[url[0], url[1], "--header", "X-Tenant: shop"]);
    assert!(ok, "{err}");
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn enqueue_refuses_blank_keys_and_self_dependencies_by_line() {
    let (db, _target) = shop(&["customers"], 10, 1).await;
    let file = temp_file(
        "{\"record_key\":\"c:1\",\"payload\":{}}\n\
         \n\
         {\"record_key\":\"   \",\"payload\":{}}\n\
         {\"record_key\":\"c:2\",\"payload\":{},\"depends_on\":\"c:2\"}\n\
         {\"record_key\":\"c:3\",\"payload\":{\"note\":\"a\\u0000b\"}}\n",
    );
    let (ok, err) = run(
        &db.url,
        &[
            "enqueue",
            "--rule",
            "customers",
            "--file",
            file.to_str().unwrap(),
        ],
    );
    assert!(!ok);
    assert!(err.contains("line 3: record_key is blank"), "{err}");
    assert!(
        err.contains("line 4: record_key \"c:2\": depends_on names"),
        "{err}"
    );
    // What the database would refuse without naming a row is named before it is asked.
    assert!(err.contains("line 5: payload.note holds a NUL"), "{err}");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM deliveries")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn unknown_variables_are_warned_about_and_an_invalid_log_filter_is_refused() {
    let db = TestDb::new().await;
    let out = courier_on(&db.url)
        .arg("status")
        .env("COURIER_WORKER_CONCURENCY", "4")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("COURIER_WORKER_CONCURENCY")
            && err.contains("did you mean COURIER_WORKER_CONCURRENCY?"),
        "{err}"
    );
    // Written to a pipe: plain text, no colour codes.
    assert!(!err.contains('\u{1b}'), "ANSI codes in piped logs: {err:?}");

    // For log shippers: one JSON object per line.
    let out = courier_on(&db.url)
        .arg("status")
        .env("COURIER_LOG_FORMAT", "json")
        .env("COURIER_WORKER_CONCURENCY", "4")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for line in lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(v.get("level").is_some(), "{line}");
    }
    let out = courier_on(&db.url)
        .arg("status")
        .env("COURIER_LOG_FORMAT", "xml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("COURIER_LOG_FORMAT"));

    let out = courier_on(&db.url)
        .arg("status")
        .env("COURIER_LOG", "[[[")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("COURIER_LOG") && err.contains("[[["), "{err}");
    let out = courier_on(&db.url)
        .arg("status")
        .env("COURIER_LOG", "warn,courier=debug")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_database_that_never_answers_fails_the_command_in_time() {
    // Accepts connections and never says a word on them.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        courier()
            .arg("status")
            .env(
                "DATABASE_URL",
                format!("postgres://courier:hunter2@127.0.0.1:{port}/courier"),
            )
            .env("COURIER_DB_CONNECT_TIMEOUT_SECONDS", "1")
            .env_remove("COURIER_LOG")
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn numeric_options_name_the_option_and_the_allowed_range() {
    let out = courier()
        .args(["connection", "add", "--name", "x", "--writer", "http_json"])
        .args([
            "--base-url",
            "http://127.0.0.1:1/",
            "--requests-per-minute",
            "-5",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--requests-per-minute") && err.contains("-5 is not in 1.."),
        "{err}"
    );
    let out = courier()
        .args([
            "rule",
            "add",
            "--name",
            "r",
            "--connection",
            "x",
            "--weight",
            "5000",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--weight") && err.contains("1..=1000"),
        "{err}"
    );
}

#[tokio::test]
async fn an_unmigrated_database_gets_one_line_naming_courier_migrate() {
    // A database that exists but was never migrated.
    let name = format!("courier_test_{:016x}", rand::random::<u64>());
    let _drop = DropDatabase::new(&name);
    let url = database_url(&name);
    courier::db::create_database(&url).await.unwrap();
    for args in [&["status"][..], &["connection", "list"], &["rule", "list"]] {
        let out = courier_on(&url).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("courier:")).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(lines[0].contains("run `courier migrate` first"), "{err}");
        assert!(!err.contains("at line"), "{err}");
    }
    let out = courier_on(&url).arg("migrate").output().unwrap();
    assert!(out.status.success());
    // A database error is said once, by PostgreSQL's own message.
    let out = courier_on(&url)
        .args(["connection", "add", "--name", "x", "--writer", "http_json"])
        .args(["--base-url", "http://127.0.0.1:1/", "--budget-key", ""])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(!err.contains("at line"), "{err}");
}

#[tokio::test]
async fn connection_list_shows_budget_timeout_and_header_names_never_values() {
    let db = TestDb::new().await;
    let (ok, err) = run(
        &db.url,
        &[
            "connection",
            "add",
            "--name",
            "crm",
            "--writer",
            "http_json",
            "--base-url",
            "http://127.0.0.1:1/",
            "--timeout-ms",
            "2500",
            "--budget-key",
            "crm-workspace",
            "--header",
            "X-Api-Key: s3cr3t-value",
            "--header",
            "X-Source: shop",
        ],
    );
    assert!(ok, "{err}");
    let out = courier_on(&db.url)
        .args(["connection", "list"])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{list}");
    for shown in ["2500", "crm-workspace", "X-Api-Key", "X-Source"] {
        assert!(list.contains(shown), "{shown} missing from:\n{list}");
    }
    assert!(
        !list.contains("s3cr3t-value") && !list.contains("shop\n"),
        "{list}"
    );
}

#[tokio::test]
async fn apply_refuses_unknown_keys_keeps_what_a_file_leaves_out_and_says_what_it_did() {
    let db = TestDb::new().await;
    let full = temp_file(
        r#"{"connections": [{"name": "crm", "writer": "http_json", "base_url": "http://127.0.0.1:1/",
                              "headers": {"X-Source": "shop"}, "max_in_flight": 3}],
            "rules": [{"name": "customers", "connection": "crm", "path": "contacts/", "batch_size": 200}]}"#,
    );
    let (ok, out) = both(&db.url, &["apply", full.to_str().unwrap()]);
    assert!(ok, "{out}");
    let (ok, out) = both(&db.url, &["rule", "disable", "customers"]);
    assert!(ok, "{out}");

    // A typo is refused by name, and nothing is applied.
    let typo = temp_file(
        r#"{"connections": [{"name": "crm", "writer": "http_json", "base_url": "http://127.0.0.1:1/", "max_inflight": 5}]}"#,
    );
    let (ok, out) = both(&db.url, &["apply", typo.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        out.contains("max_inflight") && out.contains("connection \"crm\""),
        "{out}"
    );

    // A partial file changes only what it names; a dry run saves nothing.
    let partial =
        temp_file(r#"{"rules": [{"name": "customers", "connection": "crm", "path": "people/"}]}"#);
    let (ok, out) = both(&db.url, &["apply", "--dry-run", partial.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(
        out.contains(r#"rule "customers": changed path: "contacts/" -> "people/""#),
        "{out}"
    );
    assert!(out.contains("dry run"), "{out}");
    let path: String = sqlx::query_scalar("SELECT path FROM rules")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(path, "contacts/");
    let (ok, out) = both(&db.url, &["apply", partial.to_str().unwrap()]);
    assert!(ok, "{out}");
    let (path, batch, enabled): (String, i32, bool) =
        sqlx::query_as("SELECT path, batch_size, enabled FROM rules")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((path.as_str(), batch, enabled), ("people/", 200, false));
    let (ok, out) = both(&db.url, &["apply", full.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains(r#"connection "crm": unchanged"#), "{out}");
    let in_flight: i32 = sqlx::query_scalar("SELECT max_in_flight FROM connections")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(in_flight, 3);

    // --replace: what the file leaves out takes its default.
    let (ok, out) = both(&db.url, &["apply", "--replace", partial.to_str().unwrap()]);
    assert!(ok, "{out}");
    let (batch, enabled): (i32, bool) = sqlx::query_as("SELECT batch_size, enabled FROM rules")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!((batch, enabled), (100, true));

    // A file naming nothing says so; one naming a connection twice is refused, naming it.
    let empty = temp_file("[]");
    let (ok, out) = both(&db.url, &["apply", empty.to_str().unwrap()]);
    assert!(ok && out.contains("nothing to apply"), "{out}");
    let twice = temp_file(
        r#"{"connections": [{"name": "crm", "writer": "http_json", "base_url": "http://127.0.0.1:1/"},
                            {"name": "crm", "writer": "http_json", "base_url": "http://127.0.0.1:2/"}]}"#,
    );
    let (ok, out) = both(&db.url, &["apply", twice.to_str().unwrap()]);
    assert!(
        !ok && out.contains(r#"connection "crm" is named twice"#),
        "{out}"
    );
    for f in [full, typo, partial, empty, twice] {
        let _ = std::fs::remove_file(f);
    }
}
