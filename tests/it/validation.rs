//! Validation at the door and bounded waits on the database: what the library refuses when
//! a connection, a rule or a delivery is saved (and what the schema refuses for plain SQL),
//! and that connecting and every statement have a time limit. Against the real PostgreSQL.

use std::time::{Duration, Instant};

use crate::common::*;
use courier::{
    apply::{self, CatalogFile},
    catalog::{self, CatalogError, NewConnection, NewRule},
    db::{self, DbError, PoolSettings},
    enqueue::{self, EnqueueError, NewDelivery},
};
use serde_json::json;
use sqlx::PgPool;

/// A connection named `name` to a User.com workspace (its key variable is never read here).
fn workspace(name: &str) -> NewConnection {
    NewConnection {
        name: name.into(),
        writer: "http_json".into(),
        base_url: "https://shop.user.com/api/public/".into(),
        api_key_env: Some("COURIER_TEST_USERCOM_KEY".into()),
        ..Default::default()
    }
}

fn rule(name: &str, connection: &str, path: &str) -> NewRule {
    NewRule {
        name: name.into(),
        connection: connection.into(),
        path: path.into(),
        ..Default::default()
    }
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// The message of a refusal; panics on anything but [`CatalogError::Invalid`].
fn invalid(r: Result<i64, CatalogError>) -> String {
    match r {
        Err(CatalogError::Invalid(m)) => m,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The constraint a plain SQL statement violated.
async fn violated(pool: &PgPool, sql: &str) -> String {
    let e = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .expect_err("the schema refuses it");
    e.as_database_error()
        .and_then(|d| d.constraint())
        .unwrap_or_else(|| panic!("not a constraint violation: {e}"))
        .to_owned()
}

#[tokio::test]
async fn a_rule_path_is_checked_when_saved() {
    let (db, _target) = shop(&[], 10, 1).await;
    let m = invalid(
        catalog::upsert_rule(&db.pool, &rule("customers", "shop", "users/{payload.id}/")).await,
    );
    assert!(
        m.contains("\"customers\"")
            && m.contains("{payload.id}")
            && m.contains("unknown placeholder"),
        "{m}"
    );
    assert_eq!(count(&db.pool, "SELECT count(*) FROM rules").await, 0);

    // A file is refused whole, naming the rule.
    let file = CatalogFile {
        connections: vec![],
        rules: vec![
            rule("ok", "shop", "users/{payload/id}/"),
            rule("bad", "shop", "users/{id/"),
        ],
    };
    let m = match apply::apply(&db.pool, &file).await {
        Err(CatalogError::Invalid(m)) => m,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(m.contains("\"bad\"") && m.contains("without its }"), "{m}");
    assert_eq!(count(&db.pool, "SELECT count(*) FROM rules").await, 0);
    catalog::upsert_rule(&db.pool, &rule("raw", "shop", "anything/at/all"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_connection_naming_the_writer_of_an_older_courier_is_refused_naming_its_preset() {
    let (db, _target) = shop(&["customers"], 10, 1).await;
    let conn = catalog::list_connections(&db.pool).await.unwrap().remove(0);
    let to_usercom = NewConnection {
        name: conn.name.clone(),
        writer: "usercom".into(),
        base_url: conn.base_url.clone(),
        api_key_env: Some("COURIER_TEST_USERCOM_KEY".into()),
        ..Default::default()
    };
    let m = invalid(catalog::upsert_connection(&db.pool, &to_usercom).await);
    assert!(
        m.contains("\"shop\"")
            && m.contains("writer \"usercom\" is not one of http_json")
            && m.contains("courier apply --preset usercom"),
        "{m}"
    );
    let whole = CatalogFile {
        connections: vec![to_usercom],
        rules: vec![rule("customers", "shop", "user_upsert")],
    };
    assert!(apply::apply(&db.pool, &whole).await.is_err());
    let conn = catalog::list_connections(&db.pool).await.unwrap().remove(0);
    assert_eq!(conn.writer, "http_json", "nothing was changed");
}

#[tokio::test]
async fn base_urls_and_headers_are_checked_when_saved_without_echoing_secrets() {
    let db = TestDb::new().await;
    let base = NewConnection {
        name: "crm".into(),
        writer: "http_json".into(),
        base_url: "https://crm.example.com/api/".into(),
        ..Default::default()
    };
    let with_url = |url: &str| NewConnection {
        base_url: url.into(),
        ..base.clone()
    };
    let with_header = |name: &str, value: serde_json::Value| {
        let mut c = base.clone();
        c.headers.insert(name.into(), value);
        c
    };
    let cases: Vec<(NewConnection, &[&str])> = vec![
        (with_url("http://"), &["base_url", "empty host"]),
        (with_url("http://exa mple/"), &["base_url", "blank"]),
        (
            with_url("https://crm.example.com/api/\n"),
            &["base_url", "line break"],
        ),
        (
            with_url("ftp://crm.example.com/"),
            &["base_url", "http:// or https://"],
        ),
        (
            with_url("crm.example.com/api/"),
            &["base_url", "http:// or https://"],
        ),
        (with_url("https://u:hunter2@/api/"), &["base_url", "u:***@"]),
        (
            with_url("https://u:hunter2@crm.example.com/api/"),
            &["base_url", "names a user or password", "u:***@"],
        ),
        (
            with_header("Idempotency-Key", json!("SECRET123")),
            &[
                "header Idempotency-Key cannot be set",
                "its own key per delivery",
            ],
        ),
        (
            with_header("host", json!("SECRET123")),
            &["header Host cannot be set"],
        ),
        (
            {
                let mut c = with_header("X-Dup", json!("SECRET123"));
                c.headers.insert("x-dup".into(), json!("hunter2"));
                c
            },
            &["\"X-Dup\" and \"x-dup\" are the same header"],
        ),
        (
            with_header("X-Api-Key", json!("SECRET123\r\nX-Injected: 1")),
            &["header \"X-Api-Key\"", "line break"],
        ),
        (
            with_header("Authorization", json!("Bearer SECRET123\u{7}")),
            &["header \"Authorization\"", "control character"],
        ),
        (
            with_header("X-City", json!("SECRET123\u{7f}")),
            &["header \"X-City\"", "control character"],
        ),
        (
            with_header("X Tenant", json!("shop")),
            &["header name \"X Tenant\""],
        ),
        (with_header("", json!("shop")), &["header name \"\""]),
        (
            with_header("X-Count", json!(3)),
            &["header \"X-Count\"", "string"],
        ),
        (
            NewConnection {
                api_key_env: Some("SECRET123-KEY".into()),
                ..base.clone()
            },
            &["api_key_env", "never the key itself"],
        ),
        (
            NewConnection {
                writer: "usercom".into(),
                ..base.clone()
            },
            &["writer \"usercom\"", "preset usercom"],
        ),
    ];
    for (c, expected) in &cases {
        let m = invalid(catalog::upsert_connection(&db.pool, c).await);
        assert!(m.starts_with("connection \"crm\": "), "{m}");
        for e in *expected {
            assert!(m.contains(e), "{m:?} should say {e:?}");
        }
        assert!(!m.contains("SECRET123") && !m.contains("hunter2"), "{m}");
        // `apply` refuses the same, before anything is written.
        let file = CatalogFile {
            connections: vec![c.clone()],
            rules: vec![],
        };
        assert!(matches!(
            apply::apply(&db.pool, &file).await,
            Err(CatalogError::Invalid(_))
        ));
    }
    assert_eq!(count(&db.pool, "SELECT count(*) FROM connections").await, 0);

    // What is valid is saved: a tab, punctuation and UTF-8 in a value, a port in the URL,
    // an IPv6 host.
    let mut good = with_header("X-Tenant", json!("Zürich\tA ~!\"#"));
    good.headers.insert("x-trace_id.v2".into(), json!(""));
    good.base_url = "http://[::1]:8080/api?v=2".into();
    catalog::upsert_connection(&db.pool, &good).await.unwrap();

    // Plain SQL is refused too, by the schema's checks.
    for (sql, constraint) in [
        (
            "INSERT INTO connections (name, writer, base_url) VALUES ('s', 'http_json', 'http://')",
            "connections_base_url_host",
        ),
        (
            "INSERT INTO connections (name, writer, base_url) VALUES ('s', 'http_json', 'http://exa mple/')",
            "connections_base_url_host",
        ),
        (
            "INSERT INTO connections (name, writer, base_url) VALUES ('s', 'http_json', 'http://:80/')",
            "connections_base_url_host",
        ),
        (
            r#"INSERT INTO connections (name, writer, base_url, headers) VALUES ('s', 'http_json', 'http://h/', '{"X-A": "a\nb"}')"#,
            "connections_headers_valid",
        ),
        (
            r#"INSERT INTO connections (name, writer, base_url, headers) VALUES ('s', 'http_json', 'http://h/', '{"X A": "b"}')"#,
            "connections_headers_valid",
        ),
        (
            r#"UPDATE connections SET headers = '{"X-A": 1}'"#,
            "connections_headers_valid",
        ),
        (
            r#"UPDATE connections SET headers = '{"X-A": "a\u007fb"}'"#,
            "connections_headers_valid",
        ),
    ] {
        assert_eq!(violated(&db.pool, sql).await, constraint, "{sql}");
    }
}

#[tokio::test]
async fn what_would_go_wrong_later_is_refused_when_saved_naming_the_field_never_its_value() {
    let db = TestDb::new().await;
    let base = NewConnection {
        name: "crm".into(),
        writer: "http_json".into(),
        base_url: "https://crm.example.com/api/".into(),
        api_key_env: Some("CRM_KEY".into()),
        ..Default::default()
    };
    let with_auth = |auth: serde_json::Value| NewConnection {
        auth: Some(auth),
        ..base.clone()
    };
    let oauth = json!({"kind": "oauth", "token_url": "https://login.example.com/token",
                       "client_id_env": "CRM_ID"});
    let connections: Vec<(NewConnection, &[&str])> = vec![
        (
            with_auth(json!({"kind": "bearer", "prefix": "SECRET123"})),
            &["unknown field `prefix`"],
        ),
        (
            with_auth(json!({"kind": "header", "name": "X-Key", "sceme": "SECRET123"})),
            &["unknown field `sceme`"],
        ),
        (
            with_auth(json!({"kind": "header", "name": "Authorization",
                             "scheme": "SECRET123\r\nX-Injected: 1"})),
            &["scheme", "line break"],
        ),
        (
            with_auth(json!({"kind": "header", "name": "Host"})),
            &["header name Host cannot carry the key"],
        ),
        (
            with_auth(json!({"kind": "basic", "user_env": "SECRET123-site"})),
            &["user_env is not the name of an environment variable"],
        ),
        (
            with_auth(
                json!({"kind": "oauth", "token_url": "https://login.example.com/token",
                             "client_id_env": "SECRET123 id"}),
            ),
            &["client_id_env is not the name of an environment variable"],
        ),
        (
            NewConnection {
                api_key_env: None,
                ..with_auth(oauth.clone())
            },
            &["oauth needs api_key_env"],
        ),
    ];
    for (c, expected) in &connections {
        let m = invalid(catalog::upsert_connection(&db.pool, c).await);
        for e in *expected {
            assert!(m.contains(e), "{m:?} should say {e:?}");
        }
        assert!(!m.contains("SECRET123"), "{m}");
    }
    assert_eq!(count(&db.pool, "SELECT count(*) FROM connections").await, 0);
    catalog::upsert_connection(&db.pool, &with_auth(oauth))
        .await
        .unwrap();

    let with_request = |request: serde_json::Value| NewRule {
        records_per_call: Some(10),
        request: Some(request),
        ..rule("customers", "crm", "contacts/")
    };
    let rules: Vec<(NewRule, &[&str])> = vec![
        (
            with_request(json!({"item": {"{{payload/id}}": "{{payload}}"}})),
            &["item", "object key holds a placeholder"],
        ),
        (
            with_request(json!({"body": {"inputs": "{{records}}", "trace": "{{delivery_id}}"}})),
            &["body", "{{delivery_id}} is a record's"],
        ),
        (
            with_request(json!({"body": {"inputs": "{{records}}", "...": "{{payload}}"}})),
            &["body", "spread key"],
        ),
        (
            rule("customers", "crm", "contacts/\r\nX: 1"),
            &["path holds a line break"],
        ),
        (
            rule("customers", "crm", "contacts/\tall"),
            &["path holds a control character"],
        ),
    ];
    for (r, expected) in &rules {
        let m = invalid(catalog::upsert_rule(&db.pool, r).await);
        for e in *expected {
            assert!(m.contains(e), "{m:?} should say {e:?}");
        }
    }
    assert_eq!(count(&db.pool, "SELECT count(*) FROM rules").await, 0);

    // A file naming a connection twice is refused before anything is written; one naming
    // nothing applies nothing and says so.
    let twice = CatalogFile {
        connections: vec![base.clone(), base.clone()],
        rules: vec![],
    };
    let m = invalid(apply::apply(&db.pool, &twice).await.map(|()| 0));
    assert!(m.contains("connection \"crm\" is named twice"), "{m}");
    for empty in ["", "[]", "{}"] {
        let changes = apply::apply_file(&db.pool, empty, Default::default())
            .await
            .unwrap();
        assert!(changes.is_empty(), "{empty:?}: {changes:?}");
    }
    let m = match apply::apply_file(&db.pool, "[1]", Default::default()).await {
        Err(CatalogError::Invalid(m)) => m,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(m.contains("expected a JSON object"), "{m}");
}

#[tokio::test]
async fn blank_keys_and_self_dependencies_are_refused_at_enqueue() {
    let (db, _target) = shop(&["customers"], 10, 1).await;
    let mut own = NewDelivery::new("c:2", json!({}));
    own.depends_on = Some("c:2".into());
    let mut blank_dep = NewDelivery::new("c:3", json!({}));
    blank_dep.depends_on = Some(" ".into());
    let input = vec![
        NewDelivery::new("c:1", json!({})),
        own.clone(),
        NewDelivery::new(" \t", json!({})),
        blank_dep,
    ];
    let Err(EnqueueError::BadInput(errors)) =
        enqueue::enqueue_many(&db.pool, "customers", input).await
    else {
        panic!("expected the input refused");
    };
    let at: Vec<usize> = errors.iter().map(|e| e.line).collect();
    assert_eq!(at, [2, 3, 4], "{errors:?}");
    assert!(
        errors[0].reason.contains("\"c:2\"") && errors[0].reason.contains("own key"),
        "{errors:?}"
    );
    assert!(errors[1].reason.contains("blank"), "{errors:?}");
    let e = enqueue::enqueue(&db.pool, "customers", own)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"c:2\"") && e.contains("own key"), "{e}");
    assert_eq!(count(&db.pool, "SELECT count(*) FROM deliveries").await, 0);

    // Plain SQL is refused by the schema; a dependency on another key is fine.
    for (sql, constraint) in [
        (
            "INSERT INTO deliveries (rule_id, record_key, payload) SELECT id, '  ', '{}' FROM rules",
            "deliveries_record_key_not_blank",
        ),
        (
            "INSERT INTO deliveries (rule_id, record_key, payload, depends_on) SELECT id, 'k', '{}', 'k' FROM rules",
            "deliveries_depends_on_not_self",
        ),
        (
            "INSERT INTO deliveries (rule_id, record_key, payload, depends_on) SELECT id, 'k', '{}', '' FROM rules",
            "deliveries_depends_on_not_blank",
        ),
    ] {
        assert_eq!(violated(&db.pool, sql).await, constraint, "{sql}");
    }
    let mut other = NewDelivery::new("order:1", json!({}));
    other.depends_on = Some("c:1".into());
    enqueue::enqueue(&db.pool, "customers", other)
        .await
        .unwrap();
}

/// A loopback port that accepts TCP connections and never says a word on them.
async fn silent_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    port
}

#[tokio::test]
async fn a_connect_nothing_answers_fails_in_time_naming_host_and_port() {
    let port = silent_port().await;
    let url = format!("postgres://courier:hunter2@127.0.0.1:{port}/courier");
    let settings = PoolSettings {
        connect_timeout: Duration::from_secs(1),
        ..PoolSettings::default()
    };
    let started = Instant::now();
    let e = db::connect_with(&url, &settings).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(e, DbError::ConnectTimeout { .. }), "{e:?}");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let m = e.to_string();
    assert!(m.contains(&format!("127.0.0.1:{port}")), "{m}");
    assert!(!m.contains("hunter2"), "{m}");

    // `courier db create` connects elsewhere on that server: bounded the same way.
    let started = Instant::now();
    let e = db::create_database_within(&url, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");

    // An HTTP server is not PostgreSQL either: refused in time, naming where.
    let target = courier_target::Target::start(0).await.unwrap();
    let http_port = target
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    let url = format!("postgres://courier:hunter2@127.0.0.1:{http_port}/courier");
    let started = Instant::now();
    let e = db::connect_with(&url, &settings).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3));
    let m = e.to_string();
    assert!(m.contains(&format!("127.0.0.1:{http_port}")), "{m}");
    assert!(!m.contains("hunter2"), "{m}");
}

#[tokio::test]
async fn every_pooled_connection_has_a_statement_timeout_and_migrations_none() {
    let db = TestDb::new().await;
    let settings = PoolSettings {
        max_connections: 3,
        statement_timeout: Duration::from_millis(500),
        ..PoolSettings::default()
    };
    let pool = db::connect_with(&db.url, &settings).await.unwrap();
    // Migrating borrows a connection without the limit; none such goes back to the pool.
    db::migrate(&pool).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut conn = pool.acquire().await.unwrap();
        let limit: String = sqlx::query_scalar("SHOW statement_timeout")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(limit, "500ms");
        held.push(conn);
    }
    drop(held);
    let started = Instant::now();
    let e = sqlx::query("SELECT pg_sleep(5)")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(
        e.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("57014"),
        "cancelled by statement_timeout: {e}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    // The default is a minute.
    let limit: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(limit, "1min");
}

#[tokio::test]
async fn a_rule_keeps_its_endpoints_limits_on_a_budget_of_its_own() {
    let db = TestDb::new().await;
    let mut c = workspace("shop");
    c.limits = vec!["10/s".parse().unwrap(), "150/min".parse().unwrap()];
    catalog::upsert_connection(&db.pool, &c).await.unwrap();
    // Limits without a budget of the rule's own are refused, naming why.
    let mut events = rule("events", "shop", "events");
    events.limits = vec!["350/s".parse().unwrap(), "3500/min".parse().unwrap()];
    let m = invalid(catalog::upsert_rule(&db.pool, &events).await);
    assert!(m.contains("limits need a budget_key"), "{m}");
    events.budget_key = Some("shop:events".into());
    let events_id = catalog::upsert_rule(&db.pool, &events).await.unwrap();
    let profiles_id = catalog::upsert_rule(&db.pool, &rule("profiles", "shop", "profiles"))
        .await
        .unwrap();
    // What a chain job of each rule paces against: the rule's budget and limits, else the
    // connection's.
    let (_, conn) = catalog::rule_with_connection(&db.pool, events_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(conn.budget_key, "shop:events");
    assert_eq!(conn.declared_limits(), events.limits);
    let (_, conn) = catalog::rule_with_connection(&db.pool, profiles_id)
        .await
        .unwrap()
        .unwrap();
    assert!(
        conn.budget_key.starts_with("connection:"),
        "{}",
        conn.budget_key
    );
    assert_eq!(conn.declared_limits(), c.limits);
    // Plain SQL is held to the same: limits on the connection's budget are refused.
    assert_eq!(
        violated(
            &db.pool,
            "UPDATE rules SET limits = '{10/s}' WHERE name = 'profiles'"
        )
        .await,
        "rules_limits_own_budget"
    );
}

/// Two connections (one with limits, a reserve and a shared budget, one with headers) and
/// a rule on each, for the bulk catalog tests.
fn bulk_catalog() -> (Vec<NewConnection>, Vec<NewRule>) {
    let mut limited = workspace("limited");
    limited.limits = vec!["10/s".parse().unwrap(), "600/min".parse().unwrap()];
    limited.reserve = Some("10%".into());
    limited.budget_key = Some("workspace".into());
    let sink = NewConnection {
        name: "sink".into(),
        writer: "http_json".into(),
        base_url: "https://crm.example.com/api/".into(),
        headers: json!({"X-Shop": "one"}).as_object().unwrap().clone(),
        max_in_flight: Some(3),
        ..Default::default()
    };
    let mut per_call = rule("records", "sink", "batch/");
    per_call.records_per_call = Some(50);
    per_call.weight = Some(3);
    let rules = vec![rule("customers", "limited", "user_upsert"), per_call];
    (vec![limited, sink], rules)
}

/// The catalog `connections` and `rules` read back as given, once saved on a fresh
/// database by `save_many` (`bulk`) or `save_all`.
async fn saved_back(
    connections: &[NewConnection],
    rules: &[NewRule],
    bulk: bool,
) -> (Vec<Option<NewConnection>>, Vec<Option<NewRule>>) {
    let db = TestDb::new().await;
    let mut tx = db.pool.begin().await.unwrap();
    match bulk {
        true => catalog::save_many(&mut tx, connections, rules).await,
        false => catalog::save_all(&mut tx, connections, rules).await,
    }
    .unwrap();
    tx.commit().await.unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    let (mut cs, mut rs) = (Vec::new(), Vec::new());
    for c in connections {
        cs.push(catalog::given_connection(&mut conn, &c.name).await.unwrap());
    }
    for r in rules {
        rs.push(catalog::given_rule(&mut conn, &r.name).await.unwrap());
    }
    (cs, rs)
}

#[tokio::test]
async fn a_catalog_saved_in_bulk_is_stored_as_one_saved_row_by_row() {
    let (connections, rules) = bulk_catalog();
    let by_row = saved_back(&connections, &rules, false).await;
    let in_bulk = saved_back(&connections, &rules, true).await;
    assert!(by_row.0.iter().all(Option::is_some) && by_row.1.iter().all(Option::is_some));
    assert_eq!(by_row, in_bulk);
}

#[tokio::test]
async fn a_catalog_saved_in_bulk_is_refused_as_one_saved_row_by_row() {
    let (connections, rules) = bulk_catalog();
    let db = TestDb::new().await;
    let refused = |c: Vec<NewConnection>, r: Vec<NewRule>| {
        let pool = db.pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            catalog::save_many(&mut tx, &c, &r).await.unwrap_err()
        }
    };
    let typo = refused(
        connections.clone(),
        vec![rule("typo", "limited", "users/{payload.id}/")],
    )
    .await;
    assert!(
        matches!(&typo, CatalogError::Invalid(m) if m.contains("rule \"typo\"")),
        "{typo:?}"
    );
    let unknown = refused(Vec::new(), vec![rule("lost", "nowhere", "x/")]).await;
    assert!(
        matches!(&unknown, CatalogError::NotFound { kind: "connection", name } if name == "nowhere"),
        "{unknown:?}"
    );
    // A writer courier does not have is refused, naming the preset that replaced it.
    let mut tx = db.pool.begin().await.unwrap();
    catalog::save_many(&mut tx, &connections[1..], &rules[1..])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let to_usercom = NewConnection {
        writer: "usercom".into(),
        api_key_env: Some("COURIER_TEST_USERCOM_KEY".into()),
        ..connections[1].clone()
    };
    let breaks = refused(vec![to_usercom], Vec::new()).await;
    assert!(
        matches!(&breaks, CatalogError::Invalid(m) if m.contains("preset usercom")),
        "{breaks:?}"
    );
    let writers: Vec<String> = sqlx::query_scalar("SELECT writer FROM connections")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(writers, ["http_json"], "nothing of a refused call is kept");
    assert_eq!(count(&db.pool, "SELECT count(*) FROM rules").await, 1);
}

#[tokio::test]
async fn a_rules_profile_is_parsed_once_and_anew_when_the_rule_changes() {
    let db = TestDb::new().await;
    let shop = NewConnection {
        name: "shop".into(),
        writer: "http_json".into(),
        base_url: "https://crm.example/v1/".into(),
        ..Default::default()
    };
    catalog::upsert_connection(&db.pool, &shop).await.unwrap();
    let mut r = rule("customers", "shop", "contacts");
    r.request = Some(json!({"item": {"email": "{{payload/email}}"}}));
    let id = catalog::upsert_rule(&db.pool, &r).await.unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    let load = || async {
        let (rule, conn) = catalog::rule_with_connection(&db.pool, id)
            .await
            .unwrap()
            .unwrap();
        engine.profile(&rule, &conn).unwrap()
    };
    let first = load().await;
    let again = load().await;
    assert!(
        std::sync::Arc::ptr_eq(&first, &again),
        "an unchanged rule's profile is the one parsed before"
    );
    r.request = Some(json!({"item": {"mail": "{{payload/email}}"}}));
    catalog::upsert_rule(&db.pool, &r).await.unwrap();
    let changed = load().await;
    assert!(!std::sync::Arc::ptr_eq(&first, &changed));
    assert_eq!(
        changed.request.item.as_ref().map(|t| t.raw()),
        Some(&json!({"mail": "{{payload/email}}"})),
        "the changed rule's request is parsed anew"
    );
}
