//! Targets and token endpoints that misbehave on purpose, served on loopback by a raw HTTP
//! server ([`crate::common::Server`]), against real chain jobs and PostgreSQL: a redirect to another
//! host, a token endpoint that redirects, lies about the instance, never ends, sends
//! megabytes or a lifetime of 2^64 seconds; answers that echo every credential; 2xx bodies
//! that cannot be read whole; path values that are dot segments. Each test says which case
//! it covers; every one has a control that shows the same setup delivering when the target
//! behaves.

use std::time::Duration;

use crate::common::*;
use courier::{
    catalog::{self, NewConnection, NewRule},
    enqueue::{self, NewDelivery},
    writer::{self, Call, Outgoing},
};
use serde_json::{Value, json};
use sqlx::PgPool;

/// Saves a connection on `base_url` whose key is in `key_env`.
async fn connection(
    pool: &PgPool,
    name: &str,
    base_url: &str,
    key_env: &str,
    auth: Option<Value>,
    headers: Value,
) {
    catalog::upsert_connection(
        pool,
        &NewConnection {
            name: name.into(),
            writer: "http_json".into(),
            base_url: base_url.into(),
            api_key_env: Some(key_env.into()),
            auth,
            headers: headers.as_object().cloned().unwrap_or_default(),
            requests_per_minute: Some(600_000),
            max_in_flight: Some(1),
            timeout_ms: Some(5_000),
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

/// Saves a rule: `records_per_call`, an answer map and a request shape as given.
async fn rule(
    pool: &PgPool,
    name: &str,
    conn: &str,
    path: &str,
    per_call: i32,
    answer: Option<Value>,
    request: Option<Value>,
) {
    catalog::upsert_rule(
        pool,
        &NewRule {
            name: name.into(),
            connection: conn.into(),
            path: path.into(),
            max_attempts: Some(3),
            records_per_call: Some(per_call),
            answer,
            request,
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

/// Enqueues `n` small records on `rule`.
async fn records(pool: &PgPool, rule: &str, n: usize) {
    let batch: Vec<NewDelivery> = (0..n)
        .map(|i| {
            NewDelivery::new(
                format!("{rule}:{i}"),
                json!({"n": i, "email": format!("p{i}@x.io")}),
            )
        })
        .collect();
    enqueue::enqueue_many(pool, rule, batch).await.unwrap();
}

/// Each rule's ledger rows: `(rule, outcome, error)`, in order.
async fn ledger_rows(pool: &PgPool) -> Vec<(String, String, Option<String>)> {
    sqlx::query_as(
        "SELECT r.name, l.outcome, l.error FROM ledger l JOIN deliveries d ON d.id = l.delivery_id
         JOIN rules r ON r.id = d.rule_id ORDER BY l.id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// How many deliveries of `rule` are delivered.
async fn delivered_of(pool: &PgPool, rule: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM deliveries d JOIN rules r ON r.id = d.rule_id
         WHERE r.name = $1 AND d.status = 'delivered'",
    )
    .bind(rule)
    .fetch_one(pool)
    .await
    .unwrap()
}

fn set_env(name: &str, value: &str) {
    // Each variable is one test's own: nothing else reads or writes it.
    unsafe { std::env::set_var(name, value) };
}

/// Why 1 and 5: a base URL answering 307 (or 301, 302, 303) to another host. The other
/// host hears nothing (no `api-key`, no secret header), and no record reads delivered:
/// each is `failed` naming where the target pointed.
#[tokio::test]
async fn a_redirect_carries_no_credential_and_delivers_nothing() {
    set_env("COURIER_TEST_HOSTILE_REDIRECT_KEY", "REDIRECTKEY123");
    let db = TestDb::new().await;
    let other = Server::start("127.0.0.2", |_| answer("200 OK", "", "{}")).await;
    let to = other.url.clone();
    let target = Server::start("127.0.0.1", move |s| match s.path.trim_start_matches('/') {
        p if p.starts_with("ok") => answer("200 OK", "", "{}"),
        p => {
            let code = &p[1..4];
            answer(
                &format!("{code} Moved"),
                &format!("Location: {to}{p}\r\n"),
                "",
            )
        }
    })
    .await;
    let auth = json!({"kind": "header", "name": "api-key"});
    let headers = json!({"X-Shop-Token": "HEADERSECRET77"});
    // A connection per case: each redirect is a failure its circuit counts.
    for path in ["r301", "r302", "r303", "r307", "r308", "ok"] {
        let key = "COURIER_TEST_HOSTILE_REDIRECT_KEY";
        connection(
            &db.pool,
            path,
            &target.url,
            key,
            Some(auth.clone()),
            headers.clone(),
        )
        .await;
        rule(&db.pool, path, path, &format!("{path}/"), 1, None, None).await;
        records(&db.pool, path, 1).await;
    }
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;

    assert!(
        other.seen().is_empty(),
        "the other host heard {:?}",
        other.seen()
    );
    // The control: the same connection delivers where the target answers.
    assert_eq!(delivered_of(&db.pool, "ok").await, 1);
    assert!(
        target
            .seen()
            .iter()
            .any(|s| s.header("api-key") == "REDIRECTKEY123")
    );
    let rows = ledger_rows(&db.pool).await;
    for (rule, outcome, error) in rows.iter().filter(|(r, ..)| r != "ok") {
        assert_eq!(outcome, "failed", "{rule}: {error:?}");
        let error = error.as_deref().unwrap_or_default();
        assert!(
            error.contains("redirecting to") && error.contains("127.0.0.2"),
            "{rule}: {error}"
        );
    }
    assert_eq!(rows.len(), 6, "{rows:?}");
}

/// An OAuth connection on a token server of its own: `token` says what each token
/// request is answered; the target is `base_url`.
async fn oauth(pool: &PgPool, name: &str, base_url: &str, token_url: &str, extra: Value) {
    let var = format!(
        "COURIER_TEST_HOSTILE_{}",
        name.to_uppercase().replace('-', "_")
    );
    set_env(&format!("{var}_SECRET"), "CLIENTSECRET42");
    set_env(&format!("{var}_ID"), "client-7");
    let mut auth =
        json!({"kind": "oauth", "token_url": token_url, "client_id_env": format!("{var}_ID")});
    for (k, v) in extra.as_object().into_iter().flatten() {
        auth[k] = v.clone();
    }
    connection(
        pool,
        name,
        base_url,
        &format!("{var}_SECRET"),
        Some(auth),
        json!({}),
    )
    .await;
}

/// Why 2: a token URL answering 307 to another host: the client secret never leaves for
/// it, and nothing is delivered.
#[tokio::test]
async fn a_token_endpoint_redirect_gets_no_client_secret() {
    let db = TestDb::new().await;
    let other = Server::start("127.0.0.2", |_| {
        answer(
            "200 OK",
            "",
            r#"{"access_token": "STOLEN", "expires_in": 3600}"#,
        )
    })
    .await;
    let to = other.url.clone();
    let tokens = Server::start("127.0.0.1", move |s| match s.path.as_str() {
        "/good" => answer(
            "200 OK",
            "",
            r#"{"access_token": "TOKEN-GOOD-1", "expires_in": 3600}"#,
        ),
        _ => answer(
            "307 Temporary Redirect",
            &format!("Location: {to}token\r\n"),
            "",
        ),
    })
    .await;
    let target = Server::start("127.0.0.1", |_| answer("200 OK", "", "{}")).await;
    oauth(
        &db.pool,
        "moved",
        &target.url,
        &format!("{}moved", tokens.url),
        json!({}),
    )
    .await;
    oauth(
        &db.pool,
        "good",
        &target.url,
        &format!("{}good", tokens.url),
        json!({}),
    )
    .await;
    rule(&db.pool, "via-moved", "moved", "contacts/", 1, None, None).await;
    rule(&db.pool, "via-good", "good", "contacts/", 1, None, None).await;
    records(&db.pool, "via-moved", 1).await;
    records(&db.pool, "via-good", 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;

    assert!(
        other.seen().is_empty(),
        "the other host heard {:?}",
        other.seen()
    );
    assert_eq!(delivered_of(&db.pool, "via-moved").await, 0);
    assert_eq!(delivered_of(&db.pool, "via-good").await, 1);
    let bearers: Vec<String> = target
        .seen()
        .iter()
        .map(|s| s.header("authorization"))
        .collect();
    assert_eq!(bearers, ["Bearer TOKEN-GOOD-1"]);
}

/// Why 3: a token answer whose `instance_url` names another host, plain http elsewhere,
/// a user, or a path and query: refused naming the host, and the bearer token and the
/// records go nowhere. The control: an instance URL on the token URL's own host is used.
#[tokio::test]
async fn an_instance_url_off_the_allowed_hosts_gets_nothing() {
    let db = TestDb::new().await;
    let other = Server::start("127.0.0.2", |_| answer("200 OK", "", "{}")).await;
    let instance = Server::start("127.0.0.1", |_| answer("200 OK", "", "{}")).await;
    let (evil, good) = (other.addr, instance.addr);
    let tokens = Server::start("127.0.0.1", move |s| {
        let url = match s.path.as_str() {
            "/other" => format!("http://{evil}"),
            "/user" => format!("http://good@{evil}"),
            "/user-here" => format!("http://good@{good}"),
            "/path" => format!("http://{good}/evil?x="),
            "/ftp" => format!("ftp://{good}"),
            _ => format!("http://{good}"),
        };
        answer(
            "200 OK",
            "",
            &json!({"access_token": "INSTANCE-TOKEN", "instance_url": url}).to_string(),
        )
    })
    .await;
    // The base URL names a host nobody serves: only the instance URL can take the calls.
    let base = "http://127.0.0.3:9/services/data/";
    for name in ["other", "user", "user-here", "path", "ftp", "fine"] {
        let token_url = format!("{}{name}", tokens.url);
        oauth(
            &db.pool,
            name,
            base,
            &token_url,
            json!({"instance_url": true}),
        )
        .await;
        rule(
            &db.pool,
            &format!("to-{name}"),
            name,
            "sobjects/",
            1,
            None,
            None,
        )
        .await;
        records(&db.pool, &format!("to-{name}"), 1).await;
    }
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;

    assert!(
        other.seen().is_empty(),
        "the other host heard {:?}",
        other.seen()
    );
    let paths: Vec<String> = instance.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(
        paths,
        ["/services/data/sobjects/"],
        "only the allowed instance is called"
    );
    assert_eq!(delivered_of(&db.pool, "to-fine").await, 1);
    for (name, why) in [
        ("other", "127.0.0.2\", which the connection does not allow"),
        ("user", "names a user or password"),
        ("user-here", "names a user or password"),
        ("path", "has a path, query or fragment"),
        ("ftp", "is ftp, not https"),
    ] {
        let rows = ledger_rows(&db.pool).await;
        let (_, outcome, error) = rows
            .iter()
            .find(|(r, ..)| *r == format!("to-{name}"))
            .unwrap();
        assert_eq!(outcome, "failed", "{name}");
        let error = error.as_deref().unwrap_or_default();
        assert!(
            error.contains(why) && error.contains("nothing was sent"),
            "{name}: {error}"
        );
    }
}

const BASIC_PASSWORD: &str = "BASICPASSWORD99";
const TOKEN: &str = "OAUTHTOKEN-5F3A";
const SECRETS: &[&str] = &[
    "BEARERKEY-A1",
    "KLAVIYOKEY-B2",
    "BREVOKEY-C3",
    BASIC_PASSWORD,
    "CLIENTSECRET42",
    TOKEN,
    "HEADERSECRET88",
];

/// Every credential a request carried, as the echoing target quotes it back: the
/// authorization header whole, its credential bare, a Basic password decoded, the
/// api-key header, the secret header.
fn echo(s: &Seen) -> String {
    use base64::Engine as _;
    let auth = s.header("authorization");
    let bare = auth.rsplit(' ').next().unwrap_or_default().to_owned();
    let basic = base64::engine::general_purpose::STANDARD
        .decode(&bare)
        .map(|d| String::from_utf8_lossy(&d).into_owned())
        .unwrap_or_default();
    format!(
        "auth={auth} bare={bare} basic={basic} api-key={} header={}",
        s.header("api-key"),
        s.header("x-shop-token")
    )
}

/// Why 4: a target that echoes every credential of every auth kind in a 2xx bulk answer
/// (the default per-item array, a positional map's message), a 401 and a 422 body and a
/// 429's `Retry-After` leaves none of them in any table, in status or in the metrics.
#[tokio::test]
async fn secrets_echoed_in_any_answer_reach_no_table_status_or_metrics() {
    let db = TestDb::new().await;
    let tokens = Server::start("127.0.0.1", |_| {
        answer(
            "200 OK",
            "",
            &json!({"access_token": TOKEN, "expires_in": 3600}).to_string(),
        )
    })
    .await;
    let target = Server::start("127.0.0.1", |s| {
        let echo = echo(s);
        let n = serde_json::from_str::<Vec<Value>>(&s.body).map_or(1, |v| v.len());
        let quoted = json!(format!("refused: {echo}"));
        match s.path.rsplit('/').nth(1).unwrap_or_default() {
            "items" => answer(
                "200 OK",
                "",
                &json!(vec![json!({"status": 422, "error": quoted}); n]).to_string(),
            ),
            "positional" => answer(
                "200 OK",
                "",
                &json!(vec![json!({"success": false, "errors": quoted}); n]).to_string(),
            ),
            "s401" => answer("401 Unauthorized", "", &quoted.to_string()),
            "s422" => answer("422 Unprocessable Entity", "", &quoted.to_string()),
            _ => answer(
                "429 Too Many Requests",
                &format!("Retry-After: {}\r\n", s.header("authorization")),
                "",
            ),
        }
    })
    .await;
    let kinds = [
        ("bearer", "BEARERKEY-A1", None),
        (
            "klaviyo",
            "KLAVIYOKEY-B2",
            Some(json!({"kind": "header", "name": "Authorization", "scheme": "Klaviyo-API-Key"})),
        ),
        (
            "brevo",
            "BREVOKEY-C3",
            Some(json!({"kind": "header", "name": "api-key"})),
        ),
        (
            "basic",
            BASIC_PASSWORD,
            Some(json!({"kind": "basic", "user": "anystring"})),
        ),
    ];
    let positional = json!({"kind": "positional", "success": {"equals": {"field": "/success", "value": true}}, "message": "/errors"});
    let mut names = Vec::new();
    let header = json!({"X-Shop-Token": "HEADERSECRET88"});
    for (name, key, auth) in kinds {
        let var = format!("COURIER_TEST_HOSTILE_ECHO_{}", name.to_uppercase());
        set_env(&var, key);
        for conn in [name.to_owned(), format!("{name}-limited")] {
            connection(
                &db.pool,
                &conn,
                &target.url,
                &var,
                auth.clone(),
                header.clone(),
            )
            .await;
        }
        names.push(name.to_owned());
    }
    let token_url = format!("{}token", tokens.url);
    for conn in ["oauth", "oauth-limited"] {
        oauth(&db.pool, conn, &target.url, &token_url, json!({})).await;
    }
    names.push("oauth".into());
    for name in &names {
        for (kind, per_call, answer) in [
            ("items", 2, None),
            ("positional", 2, Some(positional.clone())),
            ("s401", 1, None),
            ("s422", 1, None),
            ("s429", 1, None),
        ] {
            let rule_name = format!("{name}-{kind}");
            // A 429 blocks its budget: it gets a connection of its own, so the other
            // answers are all met.
            let conn = match kind {
                "s429" => format!("{name}-limited"),
                _ => name.clone(),
            };
            rule(
                &db.pool,
                &rule_name,
                &conn,
                &format!("{kind}/"),
                per_call,
                answer,
                None,
            )
            .await;
            records(&db.pool, &rule_name, 2).await;
        }
    }
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;

    // Each kind met the echo: refusals and failures with its text, a block per 429.
    let rows = ledger_rows(&db.pool).await;
    assert!(rows.len() >= 40, "{}", rows.len());
    assert!(
        rows.iter()
            .all(|(_, _, e)| e.as_deref().is_some_and(|e| e.contains("***"))),
        "{rows:?}"
    );
    let blocks: Vec<Option<String>> =
        sqlx::query_scalar("SELECT retry_after_raw FROM connection_blocks")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(blocks.len(), names.len(), "{blocks:?}");
    assert_leaks_nothing(&db.pool, SECRETS).await;
    let now = engine.clock.now();
    let report = courier::status::report(&db.pool, now).await.unwrap();
    let shown = format!("{report:?}{}", serde_json::to_string(&report).unwrap());
    let metrics = courier::metrics::scrape::render(&engine.metrics, &db.pool, now)
        .await
        .unwrap();
    for secret in SECRETS {
        assert!(!shown.contains(secret), "status shows {secret}");
        assert!(!metrics.contains(secret), "metrics show {secret}");
    }
}

/// No row of any table of ours holds any of `secrets`, as text, but for the headers a
/// connection was configured with (stored in its row, by design).
async fn assert_leaks_nothing(pool: &PgPool, secrets: &[&str]) {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_schema || '.' || table_name FROM information_schema.tables
         WHERE table_schema IN ('public', 'apalis') AND table_type = 'BASE TABLE'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for table in &tables {
        for secret in secrets {
            let leaked: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {table} t WHERE t::text LIKE '%' || $1 || '%'"
            )))
            .bind(secret)
            .fetch_one(pool)
            .await
            .unwrap();
            let configured = table == "public.connections" && secret.starts_with("HEADER");
            assert_eq!(
                leaked,
                i64::from(configured) * leaked,
                "{secret} in table {table}"
            );
        }
    }
}

/// Why 6: a 2xx to a call of two records that cannot be read whole, for each way of
/// reading one: a cut-off positional array, an object where the array belongs, an HTML
/// page, a keyed map's `errors` as a string, a cut-off per-item array, an empty body for
/// a positional map. No record reads delivered; each is `failed`, unaccounted for. The
/// control: the same maps read a whole answer.
#[tokio::test]
async fn an_answer_that_cannot_be_read_whole_delivers_nobody() {
    let db = TestDb::new().await;
    let target = Server::start("127.0.0.1", |s| {
        let cut = |body: &str| {
            Reply::Raw(format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len() + 200
            ))
        };
        match s.path.trim_matches('/') {
            "positional-cut" => cut(r#"[{"success":false,"errors":[]},{"success":false,"errors":[{"mess"#),
            "positional-object" => answer("200 OK", "", r#"{"success": false}"#),
            "positional-html" => answer("200 OK", "", "<html><body>Accepted</body></html>"),
            "positional-empty" => answer("200 OK", "", ""),
            "keyed-string" => answer("200 OK", "", r#"{"errors": "record 1 refused"}"#),
            "keyed-html" => answer("200 OK", "", "<html>oops</html>"),
            "indexed-string" => answer("200 OK", "", r#"{"errors": "index 1 refused"}"#),
            "items-cut" => cut(r#"[{"status": 200}, {"status": 422, "err"#),
            "items-html" => answer("200 OK", "", "<!doctype html><p>ok</p>"),
            "positional-fine" => answer("200 OK", "", r#"[{"success": true}, {"success": true}]"#),
            "keyed-fine" => answer("200 OK", "", r#"{"errors": []}"#),
            _ => answer("200 OK", "", r#"[{"status": 200}, {"status": 201}]"#),
        }
    })
    .await;
    set_env("COURIER_TEST_HOSTILE_UNREADABLE_KEY", "k3y-unreadable");
    connection(
        &db.pool,
        "crm",
        &target.url,
        "COURIER_TEST_HOSTILE_UNREADABLE_KEY",
        None,
        json!({}),
    )
    .await;
    let positional =
        json!({"kind": "positional", "success": {"equals": {"field": "/success", "value": true}}});
    let keyed =
        json!({"kind": "keyed", "errors": "/errors", "key": "/id", "record": "delivery_id"});
    let indexed = json!({"kind": "indexed", "errors": "/errors", "index": "/index"});
    let cases = [
        ("positional-cut", Some(&positional)),
        ("positional-object", Some(&positional)),
        ("positional-html", Some(&positional)),
        ("positional-empty", Some(&positional)),
        ("keyed-string", Some(&keyed)),
        ("keyed-html", Some(&keyed)),
        ("indexed-string", Some(&indexed)),
        ("items-cut", None),
        ("items-html", None),
    ];
    for (name, map) in cases {
        rule(
            &db.pool,
            name,
            "crm",
            &format!("{name}/"),
            2,
            map.cloned(),
            None,
        )
        .await;
        records(&db.pool, name, 2).await;
    }
    for (name, map) in [
        ("positional-fine", Some(&positional)),
        ("keyed-fine", Some(&keyed)),
        ("items-fine", None),
    ] {
        rule(
            &db.pool,
            name,
            "crm",
            &format!("{name}/"),
            2,
            map.cloned(),
            None,
        )
        .await;
        records(&db.pool, name, 2).await;
    }
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;

    for name in ["positional-fine", "keyed-fine", "items-fine"] {
        assert_eq!(delivered_of(&db.pool, name).await, 2, "{name}");
    }
    let rows = ledger_rows(&db.pool).await;
    for (name, _) in cases {
        assert_eq!(delivered_of(&db.pool, name).await, 0, "{name}");
        let mine: Vec<_> = rows.iter().filter(|(r, ..)| r == name).collect();
        assert_eq!(mine.len(), 2, "{name}: {mine:?}");
        for (_, outcome, error) in mine {
            assert_eq!(outcome, "failed", "{name}");
            assert!(
                error
                    .as_deref()
                    .is_some_and(|e| e.contains("unaccounted for")),
                "{name}: {error:?}"
            );
        }
    }
}

/// Why 7 and 9: a lifetime of 2^64-1 seconds is a day at most (the run goes on and
/// delivers), and a token answer of megabytes is refused after 64 KiB, delivering nothing.
#[tokio::test]
async fn a_hostile_token_answer_is_bounded() {
    let db = TestDb::new().await;
    let tokens = Server::start("127.0.0.1", |s| match s.path.as_str() {
        "/forever" => answer(
            "200 OK",
            "",
            r#"{"access_token": "FOREVER-TOKEN", "expires_in": 18446744073709551615}"#,
        ),
        _ => Reply::Huge(4 * 1024 * 1024),
    })
    .await;
    let target = Server::start("127.0.0.1", |_| answer("200 OK", "", "{}")).await;
    oauth(
        &db.pool,
        "forever",
        &target.url,
        &format!("{}forever", tokens.url),
        json!({}),
    )
    .await;
    oauth(
        &db.pool,
        "huge",
        &target.url,
        &format!("{}huge", tokens.url),
        json!({}),
    )
    .await;
    rule(&db.pool, "to-forever", "forever", "c/", 1, None, None).await;
    rule(&db.pool, "to-huge", "huge", "c/", 1, None, None).await;
    records(&db.pool, "to-forever", 2).await;
    records(&db.pool, "to-huge", 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;

    assert_eq!(delivered_of(&db.pool, "to-forever").await, 2);
    assert_eq!(delivered_of(&db.pool, "to-huge").await, 0);
    let rows = ledger_rows(&db.pool).await;
    let (_, outcome, error) = rows.iter().find(|(r, ..)| r == "to-huge").unwrap();
    assert_eq!(outcome, "failed");
    assert!(
        error
            .as_deref()
            .is_some_and(|e| e.contains("over the 65536")),
        "{error:?}"
    );
    // One token for both records of the forever connection.
    let asked = tokens
        .seen()
        .iter()
        .filter(|s| s.path == "/forever")
        .count();
    assert_eq!(asked, 1);
}

/// Why 8: a token endpoint that never answers holds back its own connection's calls only:
/// another OAuth connection's call goes out and answers while the first still waits.
#[tokio::test]
async fn a_hanging_token_endpoint_delays_no_other_connection() {
    let db = TestDb::new().await;
    let tokens = Server::start("127.0.0.1", |s| match s.path.as_str() {
        "/hang" => Reply::Hang,
        _ => answer("200 OK", "", r#"{"access_token": "QUICK-TOKEN"}"#),
    })
    .await;
    let target = Server::start("127.0.0.1", |_| answer("200 OK", "", "{}")).await;
    oauth(
        &db.pool,
        "hangs",
        &target.url,
        &format!("{}hang", tokens.url),
        json!({}),
    )
    .await;
    oauth(
        &db.pool,
        "quick",
        &target.url,
        &format!("{}quick", tokens.url),
        json!({}),
    )
    .await;
    let conns = catalog::list_connections(&db.pool).await.unwrap();
    let client = reqwest::Client::new();
    let writer_of = |name: &str| {
        writer::build(conns.iter().find(|c| c.name == name).unwrap(), &client).unwrap()
    };
    let (hangs, quick) = (writer_of("hangs"), writer_of("quick"));
    let payload = json!({"n": 1});
    let one = [Outgoing {
        delivery_id: 1,
        record_key: "k:1",
        path: "c/",
        payload: &payload,
    }];
    let call = Call {
        records: &one,
        bulk: false,
        answer: None,
        request: None,
        delete: false,
    };
    let waiting = tokio::spawn({
        let hangs = hangs.clone();
        let payload = payload.clone();
        async move {
            let one = [Outgoing {
                delivery_id: 2,
                record_key: "k:2",
                path: "c/",
                payload: &payload,
            }];
            let call = Call {
                records: &one,
                bulk: false,
                answer: None,
                request: None,
                delete: false,
            };
            hangs.write_many(call).await.map(|_| ())
        }
    });
    // The hanging fetch is under way before the quick connection asks for its token.
    within(Duration::from_secs(10), "the hanging token request", || {
        let seen = tokens.seen();
        async move { seen.iter().any(|s| s.path == "/hang") }
    })
    .await;
    let answered = tokio::time::timeout(Duration::from_secs(10), quick.write_many(call)).await;
    assert!(
        answered
            .expect("the quick connection is not held back")
            .is_ok()
    );
    assert!(
        !waiting.is_finished(),
        "the hanging connection is still waiting"
    );
    waiting.abort();
}

/// Why 10 and 13: a path placeholder filled with `.` or `..` (as it is or encoded), a
/// record key of `..`, and a value that makes the URL too long: that record is rejected
/// naming the field, never sent, and the others of the rule go on.
#[tokio::test]
async fn dot_segments_and_urls_that_cannot_be_built_reject_their_record() {
    let db = TestDb::new().await;
    let target = Server::start("127.0.0.1", |_| answer("200 OK", "", "{}")).await;
    set_env("COURIER_TEST_HOSTILE_DOTS_KEY", "k3y-dots");
    connection(
        &db.pool,
        "crm",
        &target.url,
        "COURIER_TEST_HOSTILE_DOTS_KEY",
        None,
        json!({}),
    )
    .await;
    rule(
        &db.pool,
        "items",
        "crm",
        "items/{payload/id}/update",
        1,
        None,
        None,
    )
    .await;
    rule(&db.pool, "keys", "crm", "keys/{record_key}", 1, None, None).await;
    let long = "x".repeat(100_000);
    let batch: Vec<NewDelivery> = [".", "..", "%2e%2E", long.as_str(), "fine"]
        .iter()
        .enumerate()
        .map(|(i, id)| NewDelivery::new(format!("item:{i}"), json!({"id": id})))
        .collect();
    enqueue::enqueue_many(&db.pool, "items", batch)
        .await
        .unwrap();
    enqueue::enqueue(&db.pool, "keys", NewDelivery::new("..", json!({})))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;

    let paths: Vec<String> = target.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(paths, ["/items/fine/update"]);
    let rows = ledger_rows(&db.pool).await;
    let rejected: Vec<&String> = rows
        .iter()
        .filter(|(_, o, _)| o == "rejected")
        .map(|(_, _, e)| e.as_ref().unwrap())
        .collect();
    assert_eq!(rejected.len(), 5, "{rows:?}");
    assert_eq!(
        rejected
            .iter()
            .filter(|e| e.contains("{payload/id} is a dot segment"))
            .count(),
        3
    );
    assert!(
        rejected
            .iter()
            .any(|e| e.contains("{record_key} is a dot segment"))
    );
    assert!(
        rejected
            .iter()
            .any(|e| e.contains("over the 8192 courier sends"))
    );
    assert!(rejected.iter().all(|e| e.len() < 1100));
}

/// Why 11: a rejection that quotes a megabyte payload keeps a kilobyte of it, the cut
/// marked.
#[tokio::test]
async fn a_rejection_quoting_a_huge_payload_is_cut() {
    let db = TestDb::new().await;
    let target = Server::start("127.0.0.1", |_| answer("200 OK", "", "{}")).await;
    set_env("COURIER_TEST_HOSTILE_HUGE_KEY", "k3y-huge");
    connection(
        &db.pool,
        "crm",
        &target.url,
        "COURIER_TEST_HOSTILE_HUGE_KEY",
        None,
        json!({}),
    )
    .await;
    let spread = json!({"item": {"kind": "contact", "...": "{{payload}}"}});
    rule(
        &db.pool,
        "spread",
        "crm",
        "contacts/",
        1,
        None,
        Some(spread),
    )
    .await;
    let huge = Value::Array(vec![json!("a".repeat(1000)); 1000]);
    enqueue::enqueue(&db.pool, "spread", NewDelivery::new("big:1", huge))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;

    assert!(target.seen().is_empty());
    let rows = ledger_rows(&db.pool).await;
    let [(_, outcome, Some(error))] = rows.as_slice() else {
        panic!("{rows:?}")
    };
    assert_eq!(outcome, "rejected");
    assert!(
        error.len() < 1100 && error.contains("more bytes]"),
        "{} bytes",
        error.len()
    );
    let last: String = sqlx::query_scalar("SELECT last_error FROM deliveries")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(&last, error);
}

/// Why 7, the rest of it: a token endpoint that keeps failing is a failing target: each
/// record is `failed` with its backoff (due later, not at once), the breaker counts every
/// fetch and opens, and no run is started while it is open.
#[tokio::test]
async fn a_failing_token_endpoint_backs_off_like_a_failing_target() {
    let db = TestDb::new().await;
    let tokens = Server::start("127.0.0.1", |_| answer("503 Service Unavailable", "", "{}")).await;
    let target = Server::start("127.0.0.1", |_| answer("200 OK", "", "{}")).await;
    oauth(
        &db.pool,
        "down",
        &target.url,
        &format!("{}token", tokens.url),
        json!({}),
    )
    .await;
    rule(&db.pool, "to-down", "down", "c/", 1, None, None).await;
    records(&db.pool, "to-down", 8).await;
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    let fetches = tokens.seen().len();
    drive(&engine).await;

    assert!(target.seen().is_empty());
    // Five failures open the circuit: the fetches stop there, and a second pass starts none.
    assert_eq!(fetches, 5);
    assert_eq!(tokens.seen().len(), 5);
    let (state, failures): (String, i32) =
        sqlx::query_as("SELECT state, consecutive_failures FROM circuits")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), failures), ("open", 5));
    // Each failed record is due a backoff after the moment it failed (the engine's clock).
    let due: Vec<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "SELECT next_attempt_at FROM deliveries WHERE status = 'pending' AND attempts = 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(due.len(), 5);
    let now = engine.clock.now();
    assert!(
        due.iter()
            .all(|d| *d > now + chrono::Duration::milliseconds(400)),
        "{due:?} vs {now}"
    );
}
