//! Every ready target's rules through a real worker (dispatcher, queue, chain jobs) and
//! PostgreSQL into `courier target`, which answers each vendor's batch endpoint as the vendor does (HubSpot's keyed
//! 207, Brevo's successIds and failureIds, Braze's indexed errors, Customer.io's
//! batch_index, Salesforce's positional success, Mailchimp's errors by e-mail, answers
//! without a body): a record the target refuses ends as that record's ledger row, the
//! others delivered once.

use std::sync::Arc;

use crate::common::*;
use courier::erasure::Person;
use courier::{
    apply, catalog,
    enqueue::NewDelivery,
    presets::PRESETS,
    worker::{self, Engine},
};
use courier_target::Target;
use serde_json::json;

/// Six records for `rule`, the fourth marked invalid when `one_invalid`.
fn records(rule: &str, one_invalid: bool) -> Vec<NewDelivery> {
    (0..6)
        .map(|i| {
            let mut p = json!({
                "email": format!("c{i}@example.com"), "email_address": format!("c{i}@example.com"),
                "external_id": format!("c{i}"), "metric": "Placed Order",
                "properties": {"value": i},
                "External_Id__c": format!("c{i}"), "Email": format!("c{i}@example.com"),
                "LastName": format!("Customer {i}"), "firstname": "Ada",
                "lastname": format!("Customer {i}")
            });
            // Marked for the targets that read JSON; a CSV row fails as Salesforce fails
            // a contact without its last name.
            if one_invalid && i == 3 {
                p["invalid"] = json!(true);
                p["LastName"] = json!("");
                p["lastname"] = json!("");
            }
            NewDelivery::new(format!("{rule}:{i}"), p)
        })
        .collect()
}

/// Presets whose target `courier target` answers in workspaces of their own, each with its
/// token, rather than at its root (User.com's: `tests/it/usercom.rs` drives every rule of
/// its preset through them).
const WORKSPACE_EMULATED: &[&str] = &["usercom"];

/// The presets `courier target` answers at its root (a `<name>.target.json` beside the
/// preset); any other must be one of [`WORKSPACE_EMULATED`].
fn emulated() -> Vec<&'static courier::presets::Preset> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("presets");
    let (kept, other): (Vec<&courier::presets::Preset>, Vec<_>) = PRESETS.iter().partition(|p| {
        dir.join(format!("{}.target.json", p.name)).exists()
            && !WORKSPACE_EMULATED.contains(&p.name)
    });
    for p in other {
        assert!(
            WORKSPACE_EMULATED.contains(&p.name),
            "preset {} has no presets/{}.target.json for courier target",
            p.name,
            p.name
        );
    }
    kept
}

#[tokio::test]
async fn every_presets_rules_deliver_and_refused_records_end_rejected() {
    preset_keys();
    let mut cells = Vec::new();
    let presets = emulated();
    for preset in presets.iter().copied() {
        for rule in preset.rules() {
            let db = TestDb::new().await;
            let target = Target::start(0).await.unwrap();
            // Customers the target knows already, for a rule that only updates.
            target.seed_contacts(preset.name, (0..6).map(|i| format!("c{i}@example.com")));
            let mut file = preset_rule(preset, &rule, &target.url());
            // A job whose errors are a file on the vendor's file host: the target serves it
            // at its other loopback name, the one origin the operator allows here.
            if let Some(errors) = file.pointer_mut("/rules/0/job/errors")
                && errors["url"].is_string()
            {
                let other = target.url().replace("127.0.0.1", "localhost");
                errors["origins"] = json!([other.trim_end_matches('/')]);
            }
            apply::apply_file(&db.pool, &file.to_string(), Default::default())
                .await
                .unwrap_or_else(|e| panic!("{}/{rule}: {e}", preset.name));
            // Targets that answer records one by one, or accept a job they report nothing
            // of (the bulk subscription, whose records end unconfirmed), name no refused
            // record; a job's errors do.
            let answer = &file["rules"][0]["answer"];
            let unreported = answer["kind"] == "unreported";
            let per_record =
                (answer.is_object() && !unreported) || file["rules"][0]["job"].is_object();
            courier::enqueue::enqueue_many(&db.pool, &rule, records(&rule, per_record))
                .await
                .unwrap();
            // A real worker: the dispatcher, the queue, the chain jobs.
            let engine = Arc::new(Engine::new(db.pool.clone(), settings(&db.url)));
            let worker = tokio::spawn(worker::run(engine.clone()));
            let pool = db.pool.clone();
            eventually("nothing pending or accepted", || {
                let pool = pool.clone();
                async move {
                    let pending: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM deliveries WHERE status IN ('pending', 'accepted')",
                    )
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                    pending == 0
                }
            })
            .await;
            engine.shutdown.cancel();
            worker.await.unwrap().unwrap();
            let got: Vec<(String, i64)> =
                sqlx::query_as("SELECT status, count(*) FROM deliveries GROUP BY 1 ORDER BY 1")
                    .fetch_all(&db.pool)
                    .await
                    .unwrap();
            let want: Vec<(String, i64)> = match per_record {
                true => vec![("delivered".into(), 5), ("rejected".into(), 1)],
                false if unreported => vec![("unconfirmed".into(), 6)],
                false => vec![("delivered".into(), 6)],
            };
            assert_eq!(
                got,
                want,
                "{}/{rule}: {:?}",
                preset.name,
                target.requests().first()
            );
            if per_record {
                let invalid: String = sqlx::query_scalar(
                    "SELECT d.status FROM deliveries d WHERE d.payload ? 'invalid'",
                )
                .fetch_one(&db.pool)
                .await
                .unwrap();
                assert_eq!(invalid, "rejected", "{}/{rule}", preset.name);
            }
            cells.push(format!(
                "{}/{rule}: {} calls, {:?}",
                preset.name,
                target.counters().requests,
                got
            ));
        }
    }
    println!("{}", cells.join("\n"));
    let rules: usize = presets.iter().map(|p| p.rules().len()).sum();
    assert_eq!(cells.len(), rules, "every rule of every preset ran");
}

/// Each preset's customer rule (the first it lists) and a customer as its payloads carry
/// one, named by `email`.
fn customer(preset: &str, email: &str) -> serde_json::Value {
    match preset {
        // Numbers and booleans, which HubSpot's spec takes only as text.
        "hubspot" => json!({"email": email, "firstname": "Ada", "age": 36, "vip": true}),
        "klaviyo" => json!({"email": email, "first_name": "Ada"}),
        "brevo" => json!({"email": email, "firstname": "Ada", "lastname": "Lovelace"}),
        "braze" => json!({"external_id": email, "email": email, "first_name": "Ada"}),
        "customerio" => json!({"type": "person", "action": "identify",
                               "identifiers": {"id": email}, "attributes": {"first_name": "Ada"}}),
        "mailchimp" => json!({"email_address": email, "status": "subscribed",
                              "merge_fields": {"FNAME": "Ada"}}),
        "salesforce" => json!({"External_Id__c": email, "Email": email, "LastName": "Lovelace"}),
        "keap" => json!({"email_addresses": [{"email": email, "field": "EMAIL1"}],
                         "given_name": "Ada"}),
        other => panic!("preset {other}: name its customer here"),
    }
}

/// The customer rule each preset lists first creates a customer its target does not know
/// and updates one it knows: both exist at the target afterwards, each with the record
/// courier sent, and both read delivered. The targets answer as each vendor's reference
/// says (`presets/<name>.target.json` names it per endpoint).
#[tokio::test]
async fn every_presets_customer_rule_creates_a_new_customer_and_updates_a_known_one() {
    preset_keys();
    let mut cells = Vec::new();
    let presets = emulated();
    for preset in presets.iter().copied() {
        let rule = preset.rules()[0].clone();
        let db = TestDb::new().await;
        let target = Target::start(0).await.unwrap();
        target.seed_contacts(preset.name, ["known@example.com".to_owned()]);
        let file = preset_rule(preset, &rule, &target.url());
        apply::apply_file(&db.pool, &file.to_string(), Default::default())
            .await
            .unwrap_or_else(|e| panic!("{}/{rule}: {e}", preset.name));
        let people = ["new@example.com", "Known@example.com"]
            .iter()
            .enumerate()
            .map(|(i, e)| NewDelivery::new(format!("c:{i}"), customer(preset.name, e)));
        courier::enqueue::enqueue_many(&db.pool, &rule, people.collect())
            .await
            .unwrap();
        let engine = engine(&db.pool, settings(&db.url));
        drive(&engine).await;
        let got: Vec<(String, Option<String>)> = status_and_last_error(&db.pool).await;
        let cell = format!("{}/{rule}", preset.name);
        assert!(
            got.iter().all(|(s, _)| s == "delivered"),
            "{cell}: {got:?} {:?}",
            target.requests().first()
        );
        let kept = target.contacts(preset.name);
        let keys: Vec<&str> = kept.keys().map(String::as_str).collect();
        assert_eq!(keys, ["known@example.com", "new@example.com"], "{cell}");
        // The known customer holds what courier sent, not the seed's empty record.
        assert_ne!(kept["known@example.com"], json!({}), "{cell}");
        cells.push(format!("{cell}: {keys:?}"));
    }
    println!("{}", cells.join("\n"));
    assert_eq!(cells.len(), presets.len());
}

/// Every preset's erase operation, through a real worker's eraser into `courier target`,
/// which answers as each vendor's reference says (`presets/<name>.target.json`, the
/// `erase` calls, each naming its source): a customer courier delivered is gone from the
/// target afterwards, and the connection's outcome is the one the vendor's answer means;
/// a person the target never knew is answered as the vendor answers that. Prints, per
/// preset, the calls the target read and the outcomes (the closing note's table).
#[tokio::test]
async fn every_presets_erase_forgets_a_delivered_customer_as_its_vendor_answers() {
    preset_keys();
    let mut cells = Vec::new();
    let presets = emulated();
    for preset in presets.iter().copied() {
        let rule = preset.rules()[0].clone();
        let db = TestDb::new().await;
        let target = Target::start(0).await.unwrap();
        let file = preset_rule(preset, &rule, &target.url());
        apply::apply_file(&db.pool, &file.to_string(), Default::default())
            .await
            .unwrap_or_else(|e| panic!("{}/{rule}: {e}", preset.name));
        let email = "forget.me@example.com";
        courier::enqueue::enqueue_many(
            &db.pool,
            &rule,
            vec![NewDelivery::new("c:1", customer(preset.name, email))],
        )
        .await
        .unwrap();
        let engine = engine(&db.pool, erasing(&db.url));
        drive(&engine).await;
        let cell = preset.name;
        assert!(
            target.contacts(preset.name).contains_key(email),
            "{cell}: delivered first"
        );
        let known = Person {
            email: Some(email.into()),
            external_id: Some(email.into()),
            ..Default::default()
        };
        let stranger = Person {
            email: Some("never.seen@example.com".into()),
            external_id: Some("never.seen@example.com".into()),
            ..Default::default()
        };
        let (mut outcomes, mut calls) = (Vec::new(), Vec::new());
        for person in [known, stranger] {
            let before = target.requests().len();
            let id = erase(&engine, &person).await;
            let (outcome, status) = erased_part(&db.pool, id).await;
            outcomes.push(format!(
                "{outcome} ({})",
                status.map_or("-".into(), |s| s.to_string())
            ));
            let made: Vec<String> = target.requests()[before..]
                .iter()
                .map(|r| format!("{} {}", r.method, r.path))
                .collect();
            calls.push(made.join(", then "));
        }
        assert!(
            !target.contacts(preset.name).contains_key(email),
            "{cell}: still kept"
        );
        let expected = match preset.name {
            "klaviyo" | "braze" => ["queued", "queued"],
            "hubspot" | "customerio" => ["erased", "erased"],
            _ => ["erased", "unknown"],
        };
        for (got, want) in outcomes.iter().zip(expected) {
            assert!(
                got.starts_with(want),
                "{cell}: {outcomes:?}, calls {calls:?}"
            );
        }
        cells.push(format!(
            "| {cell} | {} | {} | {} |",
            calls[0], outcomes[0], outcomes[1]
        ));
    }
    println!("{}", cells.join("\n"));
    assert_eq!(cells.len(), presets.len());
}

/// Brevo's update-only batch: a contact Brevo does not know fails the whole call (404
/// document_not_found); the call is split until that contact is alone and rejected with
/// Brevo's message, never created, while every known contact of the call is updated.
#[tokio::test]
async fn brevos_update_only_batch_rejects_an_unknown_contact_alone() {
    preset_keys();
    let preset = courier::presets::find("brevo").unwrap();
    let db = TestDb::new().await;
    let target = Target::start(0).await.unwrap();
    target.seed_contacts("brevo", (0..9).map(|i| format!("c{i}@example.com")));
    let file = preset_rule(preset, "brevo-contacts-update-only", &target.url());
    apply::apply_file(&db.pool, &file.to_string(), Default::default())
        .await
        .unwrap();
    let records = (0..9).map(|i| {
        let email = match i {
            5 => "stranger@example.com".to_owned(),
            _ => format!("c{i}@example.com"),
        };
        NewDelivery::new(
            format!("c:{i}"),
            json!({"email": email, "firstname": "Ada"}),
        )
    });
    courier::enqueue::enqueue_many(&db.pool, "brevo-contacts-update-only", records.collect())
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    let got: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT d.payload->>'email', d.status, (SELECT l.error FROM ledger l
                                                 WHERE l.delivery_id = d.id ORDER BY l.id DESC LIMIT 1)
         FROM deliveries d WHERE d.status <> 'delivered'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    let (email, status, error) = &got[0];
    assert_eq!(
        (email.as_str(), status.as_str()),
        ("stranger@example.com", "rejected")
    );
    let error = error.as_deref().unwrap_or_default();
    assert!(error.contains("No contact found for indexes 0"), "{error}");
    let kept = target.contacts("brevo");
    assert!(!kept.contains_key("stranger@example.com"), "never created");
    assert_eq!(
        kept["c4@example.com"]["attributes"],
        json!({"FIRSTNAME": "Ada"})
    );
}

/// The rate signals preset `preset` declares for its connection, if any.
fn declared_signals(preset: &courier::presets::Preset) -> Option<serde_json::Value> {
    preset.connection(&json!({})).get("rate_signals").cloned()
}

/// A connection on `url` with `signals` and one rule sending a record per call.
async fn signalled_shop(pool: &sqlx::PgPool, url: &str, signals: serde_json::Value) {
    catalog::upsert_connection(
        pool,
        &catalog::NewConnection {
            name: "crm".into(),
            writer: "http_json".into(),
            base_url: url.into(),
            max_in_flight: Some(1),
            rate_signals: Some(signals),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    catalog::upsert_rule(
        pool,
        &catalog::NewRule {
            name: "contacts".into(),
            connection: "crm".into(),
            path: "contacts".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    courier::enqueue::enqueue_many(pool, "contacts", records("contacts", false))
        .await
        .unwrap();
}

/// Every answer a preset declares as "rate limited" (Salesforce's 403
/// REQUEST_LIMIT_EXCEEDED, Keap's 403 Developer Over Qps, ...) is heard as one, from the
/// preset's data alone: nothing recorded, no attempt spent, the budget blocked. A new
/// preset's signals are tested by adding its file.
#[tokio::test]
async fn every_limit_answer_a_preset_declares_blocks_the_budget_and_spends_no_attempt() {
    let mut heard = Vec::new();
    for preset in PRESETS {
        let Some(signals) = declared_signals(preset) else {
            continue;
        };
        for limited in signals["limited"].as_array().into_iter().flatten() {
            let status = limited["status"].as_u64().unwrap();
            let marker = limited["body_contains"].as_str().unwrap_or("").to_owned();
            let db = TestDb::new().await;
            let body = format!(r#"[{{"message": "slow down", "errorCode": "{marker}"}}]"#);
            let server = Server::start("127.0.0.1", move |_| {
                answer(&format!("{status} Limited"), "", &body)
            })
            .await;
            signalled_shop(&db.pool, &server.url, signals.clone()).await;
            let engine = engine(&db.pool, settings(&db.url));
            drive(&engine).await;
            let cell = format!("{}: {status} {marker}", preset.name);
            let (attempts, pending): (i64, i64) = sqlx::query_as(
                "SELECT COALESCE(sum(attempts), 0)::int8, count(*) FILTER (WHERE status = 'pending')
                 FROM deliveries",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap();
            assert_eq!((attempts, pending), (0, 6), "{cell}");
            let ledger: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger")
                .fetch_one(&db.pool)
                .await
                .unwrap();
            assert_eq!(ledger, 0, "{cell}: nothing recorded");
            let blocks: i64 = sqlx::query_scalar("SELECT count(*) FROM connection_blocks")
                .fetch_one(&db.pool)
                .await
                .unwrap();
            assert_eq!(blocks, 1, "{cell}: the budget is blocked");
            assert!(!server.seen().is_empty(), "{cell}");
            heard.push(cell);
        }
    }
    println!("{}", heard.join("\n"));
    assert!(
        heard.len() >= 3,
        "salesforce's and keap's signals: {heard:?}"
    );
}

/// Every quota a preset declares in its vendor's own headers (or a usage header) is read
/// from an answer that states it: the budget hears the rate (the most restrictive per
/// minute) before any 429.
#[tokio::test]
async fn every_quota_a_preset_declares_in_its_own_headers_is_heard() {
    let mut heard = Vec::new();
    for preset in PRESETS {
        let Some(signals) = declared_signals(preset) else {
            continue;
        };
        let quotas = signals["quotas"].as_array().cloned().unwrap_or_default();
        // Each quota stated as 120 requests per its window (60 s where the window is sent).
        let mut lines = String::new();
        let mut want: Option<f64> = None;
        for q in &quotas {
            let Some(limit) = q["limit"].as_str() else {
                continue;
            };
            let window = match (q["window"].as_str(), q["window_seconds"].as_u64()) {
                (Some(h), _) => {
                    let n = if q["window_unit"] == "ms" { 60_000 } else { 60 };
                    lines.push_str(&format!("{h}: {n}\r\n"));
                    60
                }
                (None, Some(s)) => s,
                (None, None) => continue,
            };
            lines.push_str(&format!("{limit}: 120\r\n"));
            let rpm = 120.0 * 60.0 / window as f64;
            want = Some(want.map_or(rpm, |w: f64| w.min(rpm)));
        }
        // Each usage header as 10 used of 120 in its window.
        for u in signals["usage"].as_array().into_iter().flatten() {
            let pattern = u["pattern"].as_str().unwrap();
            let value = pattern.replace("{used}", "10").replace("{limit}", "120");
            lines.push_str(&format!("{}: {value}\r\n", u["header"].as_str().unwrap()));
            let rpm = 120.0 * 60.0 / u["window_seconds"].as_u64().unwrap() as f64;
            want = Some(want.map_or(rpm, |w: f64| w.min(rpm)));
        }
        let Some(want) = want else {
            continue;
        };
        let db = TestDb::new().await;
        let server = Server::start("127.0.0.1", move |_| answer("200 OK", &lines, "{}")).await;
        signalled_shop(&db.pool, &server.url, signals.clone()).await;
        let engine = engine(&db.pool, settings(&db.url));
        drive(&engine).await;
        let report = courier::status::report(&db.pool, engine.clock.now())
            .await
            .unwrap();
        let got = report.connections[0].advertised_rpm;
        assert!(
            got.is_some_and(|g| (g - want).abs() < 1e-6),
            "{}: heard {got:?}, stated {want}",
            preset.name
        );
        heard.push(format!("{}: {want:.3}/min", preset.name));
    }
    println!("{}", heard.join("\n"));
    assert!(
        heard.len() >= 3,
        "hubspot's, keap's, salesforce's: {heard:?}"
    );
}
