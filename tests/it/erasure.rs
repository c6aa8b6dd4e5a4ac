//! Erasure: a person forgotten in every target and in courier itself. Each test drives the
//! real engine (chain jobs, the eraser's passes) against a raw HTTP target on loopback that
//! keeps every request it read, in the hostile orders an erasure must survive: an upsert
//! pending behind a block, one enqueued after the request (while it is open and after it
//! closed), a run under way, a target job holding the person, a 429 to the delete, a person
//! the target does not know. What the target saw is the proof: no upsert of the person
//! after their delete.

use std::sync::{Arc, Mutex};

use courier::{
    catalog::{self, NewConnection, NewRule},
    enqueue::{self, NewDelivery},
    erasure::{self, EraseError, ErasureKey, Person, eraser::Eraser},
    worker::Engine,
};
use serde_json::json;

use crate::common::{self, Reply, Seen, Server, TestDb, answer};

const KEY: &str = "an-erasure-key-for-the-tests-only-0123456789";
const ANN: &str = "Ann.Example@Shop.test";

/// Settings with the erasure key.
fn settings(url: &str) -> courier::config::Settings {
    courier::config::Settings {
        erasure_key: Some(ErasureKey::new(KEY).unwrap()),
        ..common::settings(url)
    }
}

/// A target that keeps what it read and answers each request as `reply` says (by method
/// and path); 200 `{}` by default.
struct Crm {
    server: Server,
}

impl Crm {
    async fn start(reply: impl Fn(&Seen) -> Option<Reply> + Send + Sync + 'static) -> Self {
        let server = Server::start("127.0.0.1", move |s| {
            reply(s).unwrap_or_else(|| answer("200 OK", "", "{}"))
        })
        .await;
        Self { server }
    }

    /// The requests read, as `METHOD path body`.
    fn seen(&self) -> Vec<String> {
        self.server
            .seen()
            .iter()
            .map(|s| {
                let method = s
                    .head
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                format!("{method} {} {}", s.path, s.body)
            })
            .collect()
    }
}

/// Connection `crm` on `crm` with an erase operation (`DELETE people/{email}`, 404 the
/// target not knowing the person) and rule `people` naming the e-mail at `/email`.
async fn shop(crm: &Crm) -> (TestDb, Arc<Engine>) {
    let db = TestDb::new().await;
    catalog::upsert_connection(
        &db.pool,
        &NewConnection {
            name: "crm".into(),
            writer: "http_json".into(),
            base_url: crm.server.url.clone(),
            requests_per_minute: Some(600_000),
            max_in_flight: Some(1),
            timeout_ms: Some(5_000),
            erase: Some(json!({
                "identity": ["email"],
                "method": "DELETE",
                "path": "people/{payload/email}",
                "answers": {"404": "unknown"}
            })),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    catalog::upsert_rule(
        &db.pool,
        &NewRule {
            name: "people".into(),
            connection: "crm".into(),
            path: "people".into(),
            batch_size: Some(10),
            max_attempts: Some(3),
            identities: Some(json!({"email": "/email", "phone": "/phone"})),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let engine = common::engine(&db.pool, settings(&db.url));
    (db, engine)
}

/// A customer's upsert: Ann has a phone number, anyone else none.
fn person(email: &str) -> NewDelivery {
    let key = format!("customer:{}", email.to_lowercase());
    let payload = match email.eq_ignore_ascii_case(ANN) {
        true => json!({"email": email, "name": "Ann", "phone": "+48 600 100 200"}),
        false => json!({"email": email}),
    };
    NewDelivery::new(key, payload)
}

fn ann() -> Person {
    Person {
        email: Some(ANN.to_uppercase()),
        ..Default::default()
    }
}

/// Eraser passes until `erasure` closes (at most 20).
async fn erase_until_closed(engine: &Arc<Engine>, erasure: i64) {
    let eraser = Eraser::new(engine);
    for _ in 0..20 {
        eraser.run_once().await.unwrap();
        if status(&engine.pool, erasure).await == "done" {
            return;
        }
        engine.clock.advance(chrono::Duration::seconds(6));
    }
    panic!("erasure {erasure} did not close");
}

async fn status(pool: &sqlx::PgPool, erasure: i64) -> String {
    sqlx::query_scalar("SELECT status FROM erasures WHERE id = $1")
        .bind(erasure)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn outcome(pool: &sqlx::PgPool, erasure: i64) -> (String, Option<i16>, i32) {
    sqlx::query_as(
        "SELECT outcome, http_status, attempts FROM erasure_targets WHERE erasure_id = $1",
    )
    .bind(erasure)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The index of the delete in what the target read, and that no upsert of the person came
/// after it.
fn deleted_last(seen: &[String]) -> usize {
    let delete = seen
        .iter()
        .position(|s| s.starts_with("DELETE /people/ann.example%40shop.test"))
        .unwrap_or_else(|| panic!("no delete of the person in {seen:#?}"));
    let after: Vec<&String> = seen[delete + 1..]
        .iter()
        .filter(|s| s.to_lowercase().contains("ann.example"))
        .collect();
    assert!(
        after.is_empty(),
        "the person reached the target after their delete: {after:?}"
    );
    delete
}

/// The whole database as `pg_dump` writes it (data only).
fn dump(url: &str) -> String {
    let out = std::process::Command::new("pg_dump")
        .args(["--data-only", "--dbname", url])
        .output()
        .expect("pg_dump runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn an_erased_person_is_deleted_at_the_target_and_purged_from_courier() {
    let crm = Crm::start(|_| None).await;
    let (db, engine) = shop(&crm).await;
    let pool = &db.pool;
    enqueue::enqueue_many(pool, "people", vec![person(ANN), person("bob@shop.test")])
        .await
        .unwrap();
    common::drive(&engine).await;
    assert_eq!(common::delivered(pool).await, 2);
    // A later change of Ann, pending, and a failure text quoting her.
    enqueue::enqueue_many(pool, "people", vec![person(ANN)])
        .await
        .unwrap();
    sqlx::query("UPDATE runs SET error = 'the target said: ' || $1")
        .bind(ANN)
        .execute(pool)
        .await
        .unwrap();
    let id = erasure::request(pool, &ann(), "a test").await.unwrap();
    erase_until_closed(&engine, id).await;
    assert_eq!(outcome(pool, id).await, ("erased".into(), Some(200), 1));
    deleted_last(&crm.seen());
    // Bob is untouched; nothing of Ann is left in any table.
    assert_eq!(common::delivered(pool).await, 1);
    let dumped = dump(&db.url).to_lowercase();
    for value in ["ann.example", "customer:ann", "600 100 200", "48600100200"] {
        assert!(!dumped.contains(value), "the dump still holds {value:?}");
    }
    assert!(dumped.contains("bob@shop.test"));
    // The audit stays, naming her by keyed hash only.
    let hashes: i64 =
        sqlx::query_scalar("SELECT count(*) FROM erased_identities WHERE erasure_id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(hashes, 1, "her e-mail's keyed hash");
}

#[tokio::test]
async fn an_upsert_pending_behind_a_block_is_suppressed_not_sent() {
    let crm = Crm::start(|_| None).await;
    let (db, engine) = shop(&crm).await;
    let pool = &db.pool;
    enqueue::enqueue_many(pool, "people", vec![person(ANN)])
        .await
        .unwrap();
    // The budget is blocked: Ann's upsert waits.
    let key = catalog::budget_key_of(pool, "crm").await.unwrap().unwrap();
    let now = engine.clock.now();
    courier::ratelimit::blocks::block_by_hand(
        pool,
        &key,
        1,
        now + chrono::Duration::seconds(30),
        Some("30"),
        now,
    )
    .await
    .unwrap();
    let id = erasure::request(pool, &ann(), "a test").await.unwrap();
    // The block lapses while the erasure is under way; the run finds nothing to send.
    Eraser::new(&engine).run_once().await.unwrap();
    engine.clock.advance(chrono::Duration::seconds(31));
    common::drive(&engine).await;
    erase_until_closed(&engine, id).await;
    let seen = crm.seen();
    assert_eq!(
        deleted_last(&seen),
        0,
        "the delete is the only call: {seen:?}"
    );
    assert_eq!(seen.len(), 1);
}

#[tokio::test]
async fn an_upsert_enqueued_after_the_erasure_is_suppressed_while_open_and_after() {
    let crm = Crm::start(|_| None).await;
    let (db, engine) = shop(&crm).await;
    let pool = &db.pool;
    let id = erasure::request(pool, &ann(), "a test").await.unwrap();
    // A second after the request, before any worker looked at it: the shop's own sync.
    enqueue::enqueue_many(pool, "people", vec![person(ANN), person("bob@shop.test")])
        .await
        .unwrap();
    common::drive(&engine).await;
    let seen = crm.seen();
    assert_eq!(seen.len(), 1, "only Bob went out: {seen:?}");
    assert!(seen[0].contains("bob@shop.test"));
    let (status, payload, error): (String, serde_json::Value, Option<String>) = sqlx::query_as(
        "SELECT d.status, d.payload, d.last_error FROM deliveries d
         WHERE d.record_key LIKE 'customer:ann%'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(status, "suppressed");
    assert_eq!(payload, json!({}), "its payload is not kept");
    assert_eq!(
        error.as_deref(),
        Some(&*format!("its person is erased (erasure {id})"))
    );
    erase_until_closed(&engine, id).await;
    // After the erasure closed, known by keyed hash only: still stopped, her e-mail in
    // another case under another key. A phone number alone was not in the erasure.
    let later = NewDelivery::new("customer:ann-2", json!({"email": ANN.to_uppercase()}));
    let phone = NewDelivery::new(
        "customer:x",
        json!({"email": "x@shop.test", "phone": "+48600100200"}),
    );
    enqueue::enqueue_many(pool, "people", vec![later, phone])
        .await
        .unwrap();
    common::drive(&engine).await;
    let seen = crm.seen();
    assert_eq!(
        seen.len(),
        3,
        "Bob's upsert, Ann's delete, x's upsert: {seen:?}"
    );
    assert!(seen[2].contains("x@shop.test"));
    let suppressed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM deliveries WHERE record_key = 'customer:ann-2'
         AND status = 'suppressed' AND payload = '{}'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(suppressed, 1);
}

#[tokio::test]
async fn a_person_erased_by_phone_is_suppressed_by_hash_after_the_erasure_closed() {
    let crm = Crm::start(|_| None).await;
    let (db, engine) = shop(&crm).await;
    let pool = &db.pool;
    let by_phone = Person {
        phone: Some("+48 600-100-200".into()),
        ..Default::default()
    };
    let id = erasure::request(pool, &by_phone, "a test").await.unwrap();
    erase_until_closed(&engine, id).await;
    // The connection's erase names a person by e-mail only.
    assert_eq!(outcome(pool, id).await.0, "no_identity");
    enqueue::enqueue_many(pool, "people", vec![person(ANN)])
        .await
        .unwrap();
    common::drive(&engine).await;
    assert!(crm.seen().is_empty(), "{:?}", crm.seen());
    // Lifted (she consented again): her records go out again.
    let key = ErasureKey::new(KEY).unwrap();
    let lifted = erasure::lift(pool, &key, &by_phone, "a test")
        .await
        .unwrap();
    assert_eq!(lifted, vec![id]);
    enqueue::enqueue_many(pool, "people", vec![person(ANN)])
        .await
        .unwrap();
    common::drive(&engine).await;
    assert_eq!(crm.seen().len(), 1);
    let lifted_by: Option<String> =
        sqlx::query_scalar("SELECT lifted_by FROM erasures WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(lifted_by.as_deref(), Some("a test"));
}

#[tokio::test]
async fn the_delete_waits_for_a_run_under_way_and_a_target_job_holding_the_person() {
    let crm = Crm::start(|_| None).await;
    let (db, engine) = shop(&crm).await;
    let pool = &db.pool;
    // A target job holding an earlier record of hers (accepted, its fate pending).
    let delivery: i64 = sqlx::query_scalar(
        "INSERT INTO deliveries (rule_id, record_key, payload, status)
         SELECT id, 'customer:ann-old', $1, 'accepted' FROM rules RETURNING id",
    )
    .bind(json!({"email": ANN}))
    .fetch_one(pool)
    .await
    .unwrap();
    let job: i64 = sqlx::query_scalar(
        "INSERT INTO target_jobs (rule_id, run_id, target_id, delivery_ids, submitted_at,
                                  next_poll_at, poll_every_ms)
         SELECT id, 1, 'job-1', ARRAY[$1::bigint], now(), now() + interval '1 hour', 1000
         FROM rules RETURNING id",
    )
    .bind(delivery)
    .fetch_one(pool)
    .await
    .unwrap();
    // And a run under way (its chain job not yet run): it may have claimed her upsert.
    enqueue::enqueue_many(pool, "people", vec![person(ANN)])
        .await
        .unwrap();
    courier::dispatcher::Dispatcher::new(&engine)
        .run_once()
        .await
        .unwrap();
    let run: i64 = sqlx::query_scalar("SELECT id FROM runs WHERE active")
        .fetch_one(pool)
        .await
        .unwrap();
    let id = erasure::request(pool, &ann(), "a test").await.unwrap();
    let eraser = Eraser::new(&engine);
    let waiting = || async {
        sqlx::query_scalar::<_, Option<String>>(
            "SELECT waiting_for FROM erasure_targets WHERE erasure_id = $1",
        )
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
    };
    eraser.run_once().await.unwrap();
    assert_eq!(
        waiting().await.as_deref(),
        Some(&*format!(
            "waiting for run {run} of rule people, under way when the erasure was asked"
        ))
    );
    // The run ends (its claim passes the gate: nothing of hers is sent); the job holds on.
    for job in common::take_jobs(&engine).await {
        common::run_job(&engine, &job).await;
    }
    engine.clock.advance(chrono::Duration::seconds(6));
    eraser.run_once().await.unwrap();
    assert_eq!(
        waiting().await.as_deref(),
        Some(&*format!(
            "waiting for target job {job} of rule people, which holds their records"
        ))
    );
    assert!(crm.seen().is_empty(), "{:?}", crm.seen());
    sqlx::query("UPDATE target_jobs SET status = 'complete', finished_at = now()")
        .execute(pool)
        .await
        .unwrap();
    erase_until_closed(&engine, id).await;
    assert_eq!(crm.seen().len(), 1);
    deleted_last(&crm.seen());
}

#[tokio::test]
async fn a_429_to_the_delete_blocks_the_budget_and_spends_no_attempt() {
    let refused = Arc::new(Mutex::new(false));
    let first = refused.clone();
    let crm = Crm::start(move |s| {
        let mut done = first.lock().unwrap();
        (s.head.starts_with("DELETE") && !*done).then(|| {
            *done = true;
            answer("429 Too Many Requests", "Retry-After: 2\r\n", "{}")
        })
    })
    .await;
    let (db, engine) = shop(&crm).await;
    let pool = &db.pool;
    let id = erasure::request(pool, &ann(), "a test").await.unwrap();
    Eraser::new(&engine).run_once().await.unwrap();
    assert_eq!(outcome(pool, id).await, ("pending".into(), None, 0));
    let blocked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM connection_blocks WHERE rule_id IS NULL")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(blocked, 1, "the 429 blocks the connection's budget");
    erase_until_closed(&engine, id).await;
    assert_eq!(outcome(pool, id).await, ("erased".into(), Some(200), 1));
    assert_eq!(crm.seen().len(), 2);
}

#[tokio::test]
async fn a_person_the_target_does_not_know_is_done_and_a_connection_without_an_erase_is_reported() {
    let crm = Crm::start(|s| {
        s.head
            .starts_with("DELETE")
            .then(|| answer("404 Not Found", "", r#"{"code": "document_not_found"}"#))
    })
    .await;
    let (db, engine) = shop(&crm).await;
    let pool = &db.pool;
    catalog::upsert_connection(
        pool,
        &NewConnection {
            name: "no-erase".into(),
            writer: "http_json".into(),
            base_url: crm.server.url.clone(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let id = erasure::request(pool, &ann(), "a test").await.unwrap();
    erase_until_closed(&engine, id).await;
    let parts: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT connection, outcome, error FROM erasure_targets WHERE erasure_id = $1 ORDER BY connection",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(parts[0].0, "crm");
    assert_eq!(parts[0].1, "unknown");
    assert_eq!(parts[1].0, "no-erase");
    assert_eq!(parts[1].1, "no_operation");
    assert!(
        parts[1]
            .2
            .as_deref()
            .unwrap()
            .contains("no erase operation")
    );
}

#[tokio::test]
async fn bad_identities_are_refused_naming_the_field_and_the_same_person_is_one_erasure() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let cases = [
        (Person::default(), "no identity"),
        (
            Person {
                email: Some("not an address".into()),
                ..Default::default()
            },
            "email",
        ),
        (
            Person {
                phone: Some("call me".into()),
                ..Default::default()
            },
            "phone",
        ),
        (
            Person {
                keys: vec![" ".into()],
                ..Default::default()
            },
            "keys",
        ),
    ];
    for (person, names) in cases {
        match erasure::request(pool, &person, "a test").await {
            Err(EraseError::Invalid(why)) => assert!(why.contains(names), "{why}"),
            other => panic!("{person:?}: {other:?}"),
        }
    }
    let unknown = sqlx::query_scalar::<_, i64>("SELECT courier_erase('{\"fax\": \"1\"}')")
        .fetch_one(pool)
        .await
        .unwrap_err();
    assert!(
        unknown
            .to_string()
            .contains("unknown identity kind \"fax\"")
    );
    let first = erasure::request(pool, &ann(), "a test").await.unwrap();
    let again = Person {
        email: Some(format!("  {}  ", ANN.to_lowercase())),
        ..Default::default()
    };
    assert_eq!(
        erasure::request(pool, &again, "a test").await.unwrap(),
        first
    );
}

#[tokio::test]
async fn a_worker_without_the_key_holds_deliveries_back_once_anyone_is_erased() {
    let crm = Crm::start(|_| None).await;
    let (db, _) = shop(&crm).await;
    let pool = &db.pool;
    let keyless = common::engine(pool, common::settings(&db.url));
    erasure::request(pool, &ann(), "a test").await.unwrap();
    enqueue::enqueue_many(pool, "people", vec![person("bob@shop.test")])
        .await
        .unwrap();
    common::drive(&keyless).await;
    assert!(crm.seen().is_empty());
    let (status, error): (String, Option<String>) = sqlx::query_as(
        "SELECT d.status, l.error FROM deliveries d JOIN ledger l ON l.delivery_id = d.id",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(status, "pending");
    assert!(error.unwrap().contains("COURIER_ERASURE_KEY"));
}

#[tokio::test]
async fn a_target_taking_several_people_a_call_gets_them_in_one() {
    let crm = Crm::start(|_| None).await;
    let (db, engine) = shop(&crm).await;
    let pool = &db.pool;
    sqlx::query(
        r#"UPDATE connections SET erase = '{"identity": ["email"], "path": "people/forget",
             "batch_size": 50, "item": "{{payload/email}}", "body": {"emails": "{{records}}"}}'"#,
    )
    .execute(pool)
    .await
    .unwrap();
    let mut ids = Vec::new();
    for who in ["ann@shop.test", "bob@shop.test", "cy@shop.test"] {
        let person = Person {
            email: Some(who.into()),
            ..Default::default()
        };
        ids.push(erasure::request(pool, &person, "a test").await.unwrap());
    }
    for id in &ids {
        erase_until_closed(&engine, *id).await;
        assert_eq!(outcome(pool, *id).await, ("erased".into(), Some(200), 1));
    }
    let seen = crm.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let body: serde_json::Value = serde_json::from_str(
        seen[0]
            .split_once(' ')
            .unwrap()
            .1
            .split_once(' ')
            .unwrap()
            .1,
    )
    .unwrap();
    assert_eq!(
        body,
        json!({"emails": ["ann@shop.test", "bob@shop.test", "cy@shop.test"]})
    );
}

#[tokio::test]
async fn a_plain_sql_enqueue_for_a_paused_rule_is_suppressed_and_emptied_at_once() {
    let crm = Crm::start(|_| None).await;
    let (db, engine) = shop(&crm).await;
    let pool = &db.pool;
    let id = erasure::request(pool, &ann(), "a test").await.unwrap();
    erase_until_closed(&engine, id).await;
    courier::ops::set_rule_paused(pool, "people", true)
        .await
        .unwrap();
    // The shop's own sync, by plain SQL, for a rule no run will claim from for now.
    sqlx::query(
        "INSERT INTO deliveries (rule_id, record_key, payload)
         SELECT id, 'customer:ann-again', $1 FROM rules",
    )
    .bind(json!({"email": ANN.to_lowercase(), "phone": "+48 600 100 200"}))
    .execute(pool)
    .await
    .unwrap();
    courier::dispatcher::Dispatcher::new(&engine)
        .run_once()
        .await
        .unwrap();
    let (status, payload): (String, serde_json::Value) = sqlx::query_as(
        "SELECT status, payload FROM deliveries WHERE record_key = 'customer:ann-again'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), payload), ("suppressed", json!({})));
    assert_eq!(crm.seen().len(), 1, "only her delete: {:?}", crm.seen());
}
