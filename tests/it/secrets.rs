//! No secret at rest or on screen: a target that echoes the connection's key and secret
//! header values back (in 401, 403, 422, 500 bodies, as is, after `Bearer `/`Token `,
//! URL-encoded, and in a 429's header) leaves none of them in any table or in status.

use crate::common::*;
use courier::enqueue::{self, NewDelivery};
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

const KEY: &str = "SECRETKEY123";
const HEADER_SECRET: &str = "HDRSECRET456/+";

/// A target that answers each path with a status and a body (and headers) echoing the
/// credentials it was sent.
async fn echoing_target() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let mut read = 0;
                // Headers and the small JSON body arrive in one or two reads.
                while read < buf.len() {
                    let n = socket.read(&mut buf[read..]).await.unwrap_or(0);
                    read += n;
                    let text = String::from_utf8_lossy(&buf[..read]);
                    if n == 0 || text.contains("\r\n\r\n") && text.ends_with('}') {
                        break;
                    }
                }
                let request = String::from_utf8_lossy(&buf[..read]).into_owned();
                let path = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let header = |name: &str| {
                    request
                        .lines()
                        .find(|l| l.to_ascii_lowercase().starts_with(&format!("{name}:")))
                        .map(|l| l.split_once(':').unwrap().1.trim().to_owned())
                        .unwrap_or_default()
                };
                let auth = header("authorization");
                let api_key = header("x-api-key");
                let encoded: String = api_key
                    .bytes()
                    .map(|b| match b {
                        b'/' => "%2F".into(),
                        b'+' => "%2B".into(),
                        _ => (b as char).to_string(),
                    })
                    .collect();
                let (status, extra, body) = if path.contains("s401") {
                    (
                        "401 Unauthorized",
                        String::new(),
                        format!(r#"{{"detail":"invalid token {auth}"}}"#),
                    )
                } else if path.contains("s403") {
                    (
                        "403 Forbidden",
                        String::new(),
                        format!(r#"{{"detail":"key={encoded} refused"}}"#),
                    )
                } else if path.contains("s422") {
                    (
                        "422 Unprocessable Entity",
                        String::new(),
                        format!(r#"{{"errors":["{api_key} is not allowed"]}}"#),
                    )
                } else if path.contains("s500") {
                    let bare = auth.trim_start_matches("Bearer ");
                    (
                        "500 Internal Server Error",
                        String::new(),
                        format!("boom {bare}"),
                    )
                } else {
                    (
                        "429 Too Many Requests",
                        format!("Retry-After: {auth}\r\n"),
                        "slow down".into(),
                    )
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}/")
}

#[tokio::test]
async fn keys_echoed_by_a_target_are_stored_nowhere() {
    // The variable is this test's own: nothing else reads or writes it.
    unsafe { std::env::set_var("COURIER_TEST_ECHOED_KEY", KEY) };
    let db = TestDb::new().await;
    let base_url = echoing_target().await;
    sqlx::query(
        "INSERT INTO connections (name, writer, base_url, api_key_env, headers, requests_per_minute)
         VALUES ('echo', 'http_json', $1, 'COURIER_TEST_ECHOED_KEY', $2, 600000)",
    )
    .bind(&base_url)
    .bind(json!({ "X-Api-Key": HEADER_SECRET }))
    .execute(&db.pool)
    .await
    .unwrap();
    for path in ["s401", "s403", "s422", "s500", "s429"] {
        sqlx::query(
            "INSERT INTO rules (name, connection_id, path, max_attempts)
             SELECT $1, id, $1 || '/', 1 FROM connections",
        )
        .bind(path)
        .execute(&db.pool)
        .await
        .unwrap();
        enqueue::enqueue(&db.pool, path, NewDelivery::new("k:1", json!({})))
            .await
            .unwrap();
    }
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    // The 429 blocked the budget for the default minute (its Retry-After was no wait).
    engine.clock.advance(chrono::Duration::seconds(61));
    drive(&engine).await;

    let outcomes: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT outcome, error FROM ledger ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(outcomes.len(), 4, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|(_, e)| e.as_deref().is_some_and(|e| e.contains("***"))),
        "{outcomes:?}"
    );
    let raw: Option<String> = sqlx::query_scalar("SELECT retry_after_raw FROM connection_blocks")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(raw.as_deref().is_some_and(|r| r.contains("***")), "{raw:?}");

    // Every row of every table of ours, as text.
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(tables.contains(&"circuits".to_string()));
    let secrets = [KEY, HEADER_SECRET, "HDRSECRET456%2F%2B"];
    for table in &tables {
        let leaked: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} t
             WHERE t::text LIKE '%' || $1 || '%' OR t::text LIKE '%' || $2 || '%'
                OR t::text LIKE '%' || $3 || '%'"
        )))
        .bind(secrets[0])
        .bind(secrets[1])
        .bind(secrets[2])
        .fetch_one(&db.pool)
        .await
        .unwrap();
        // The connection's own row holds the header it was configured with, by design.
        let expected = i64::from(table == "connections");
        assert_eq!(leaked, expected, "a secret in table {table}");
    }
    let report = courier::status::report(&db.pool, engine.clock.now())
        .await
        .unwrap();
    // Every field of the report (the command line's tables and the dashboard show only
    // these), and its JSON.
    let shown = format!("{report:?}{}", serde_json::to_string(&report).unwrap());
    for secret in secrets {
        assert!(!shown.contains(secret), "status shows {secret}");
    }
}
