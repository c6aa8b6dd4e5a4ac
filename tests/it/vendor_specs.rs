//! The Klaviyo and Brevo presets' requests checked against the vendors' own OpenAPI specs
//! (MIT, copied into `tests/specs/`) by a validator nobody here wrote: Stoplight Prism, run
//! as a validating mock (`scripts/install-prism` installs it from npm). Each rule's records
//! go through a real chain job and PostgreSQL into Prism: a request the spec refuses is
//! answered 422 and would end `rejected`; every record must end as the spec's answer says.

use std::{
    net::TcpListener,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::common::*;
use courier::{apply, enqueue::NewDelivery, presets};
use serde_json::{Value, json};

/// The repository's root.
fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Prism mocking `spec` on a free loopback port, killed when dropped.
struct Prism {
    child: Child,
    port: u16,
}

impl Prism {
    /// Prism on `spec`, a path under `tests/specs/`.
    fn start(spec: &str) -> Self {
        let out = Command::new("bash")
            .arg(root().join("scripts/install-prism"))
            .stderr(Stdio::inherit())
            .output()
            .expect("running scripts/install-prism");
        assert!(out.status.success(), "scripts/install-prism failed");
        let prism = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(prism)
            .args([
                "mock",
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "--errors",
            ])
            .arg(root().join("tests/specs").join(spec))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting prism");
        let p = Prism { child, port };
        let ready = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < ready, "prism did not listen within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Prism {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `revision` header's value the spec's operation names (its parameter's default).
fn spec_revision(spec: &str) -> String {
    let text = std::fs::read_to_string(root().join("tests/specs/klaviyo").join(spec)).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    doc["paths"]
        .as_object()
        .into_iter()
        .flat_map(|paths| paths.values())
        .filter_map(Value::as_object)
        .flat_map(|ops| ops.values())
        .filter_map(|op| op["parameters"].as_array())
        .flatten()
        .find(|p| p["name"] == "revision")
        .and_then(|p| p["schema"]["default"].as_str())
        .expect("the spec names a revision")
        .to_owned()
}

/// The limits the spec's operation states (`x-klaviyo-ratelimit`: burst and steady), as a
/// rule's `limits` write them: `["75/s", "750/min"]`.
fn spec_limits(spec: &str) -> Vec<String> {
    let text = std::fs::read_to_string(root().join("tests/specs/klaviyo").join(spec)).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let op = doc["paths"]
        .as_object()
        .and_then(|paths| paths.values().next())
        .and_then(|ops| ops.get("post"))
        .expect("the spec's one operation");
    let limits = &op["x-klaviyo-ratelimit"];
    let steady = limits["steady"].as_str().expect("a steady limit");
    let burst = limits["burst"].as_str().expect("a burst limit");
    vec![burst.to_owned(), steady.replace("/m", "/min")]
}

/// Records as each Klaviyo rule's templates take them.
fn records(rule: &str) -> Vec<NewDelivery> {
    (0..3)
        .map(|i| {
            let payload = match rule {
                "klaviyo-profiles" => json!({"email": format!("p{i}@example.com"),
                    "external_id": format!("{i}"), "first_name": "Ada", "properties": {"plan": "pro"}}),
                _ => json!({"email": format!("p{i}@example.com"), "metric": "Placed Order",
                    "properties": {"value": i}}),
            };
            NewDelivery::new(format!("{rule}:{i}"), payload)
        })
        .collect()
}

#[tokio::test]
async fn the_klaviyo_presets_requests_pass_klaviyos_own_spec() {
    preset_keys();
    let preset = presets::find("klaviyo").unwrap();
    let file: Value = serde_json::from_str(preset.text).unwrap();
    for (rule, spec, path) in [
        (
            "klaviyo-profiles",
            "create_or_update_profile.json",
            "profile-import",
        ),
        ("klaviyo-events", "create_event.json", "events"),
        (
            "klaviyo-subscribe",
            "bulk_subscribe_profiles.json",
            "profile-subscription-bulk-create-jobs",
        ),
        (
            "klaviyo-events-bulk",
            "bulk_create_events.json",
            "event-bulk-create-jobs",
        ),
    ] {
        let prism = Prism::start(&format!("klaviyo/prism/{spec}"));
        let api = format!("{}api/", prism.base_url());
        // The validator is on: a body the spec refuses is answered 422.
        let refused = reqwest::Client::new()
            .post(format!("{api}{path}"))
            .header("authorization", format!("Klaviyo-API-Key {PRESET_KEY}"))
            .header("revision", "2026-07-15")
            .header("content-type", "application/vnd.api+json")
            .header("accept", "application/vnd.api+json")
            .body(r#"{"data": {"attributes": {}}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(
            refused.status().as_u16(),
            422,
            "{rule}: prism must validate bodies"
        );
        // The revision the preset sends is the spec's (Prism checks only that one is sent).
        let sent = file["connections"][0]["headers"]["revision"].as_str();
        assert_eq!(sent, Some(spec_revision(spec).as_str()), "{rule}");
        // The rule's budget is the endpoint's, as Klaviyo's spec states it.
        let declared = file["rules"]
            .as_array()
            .and_then(|rules| rules.iter().find(|r| r["name"] == rule))
            .map(|r| r["limits"].clone());
        assert_eq!(declared, Some(json!(spec_limits(spec))), "{rule}: limits");

        let db = TestDb::new().await;
        let mut mine = file.clone();
        mine["connections"][0]["base_url"] = json!(api);
        mine["rules"]
            .as_array_mut()
            .unwrap()
            .retain(|r| r["name"] == rule);
        apply::apply_file(&db.pool, &mine.to_string(), Default::default())
            .await
            .unwrap();
        courier::enqueue::enqueue_many(&db.pool, rule, records(rule))
            .await
            .unwrap();
        let engine = engine(&db.pool, settings(&db.url));
        drive(&engine).await;
        let rows: Vec<(String, Option<String>)> = status_and_last_error(&db.pool).await;
        // A bulk job's 202 takes the records and says nothing of each.
        let want = match mine["rules"][0]["answer"]["kind"] == "unreported" {
            true => "unconfirmed",
            false => "delivered",
        };
        assert!(rows.iter().all(|(s, _)| s == want), "{rule}: {rows:?}");
    }
}

#[tokio::test]
async fn the_brevo_contacts_import_passes_brevos_own_spec_and_its_answer_confirms_nothing() {
    preset_keys();
    let prism = Prism::start("brevo/import_contacts.json");
    // The validator is on: an import without its contacts is refused (400: the answer the
    // spec declares for a bad request).
    let refused = reqwest::Client::new()
        .post(format!("{}contacts/import", prism.base_url()))
        .header("api-key", PRESET_KEY)
        .json(&json!({"jsonBody": "not a list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 400, "prism must validate bodies");
    let preset = presets::find("brevo").unwrap();
    let mut file: Value = serde_json::from_str(preset.text).unwrap();
    file["connections"][0]["base_url"] = json!(prism.base_url());
    file["rules"]
        .as_array_mut()
        .unwrap()
        .retain(|r| r["name"] == "brevo-contacts-import");
    file["rules"][0]["job"]["first_poll_seconds"] = json!(1);
    let db = TestDb::new().await;
    apply::apply_file(&db.pool, &file.to_string(), Default::default())
        .await
        .unwrap();
    let contacts = (0..3).map(|i| {
        let payload = json!({"email": format!("c{i}@example.com"),
                             "attributes": {"FNAME": "Ada", "LNAME": format!("L{i}")}});
        NewDelivery::new(format!("c:{i}"), payload)
    });
    courier::enqueue::enqueue_many(&db.pool, "brevo-contacts-import", contacts.collect())
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    let statuses = || async {
        sqlx::query_as::<_, (String, i64)>(
            "SELECT status, count(*) FROM deliveries GROUP BY 1 ORDER BY 1",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap()
    };
    // The spec's 202 names the process: the records are Brevo's, their fate pending.
    assert_eq!(statuses().await, [("accepted".into(), 3)]);
    engine.clock.advance(chrono::Duration::seconds(1));
    let polled = courier::poller::Poller::new(&engine)
        .run_once()
        .await
        .unwrap();
    assert_eq!(polled, 1);
    // The spec's process answer says `completed` and names no report: nothing of each
    // record, so none reads delivered.
    assert_eq!(statuses().await, [("unconfirmed".into(), 3)]);
}

/// Brevo's contact rules (`createContact` with updateEnabled, one per call, and the
/// update-only `updateBatchContacts`) send what Brevo's own spec takes: the attributes
/// named in upper case beside the e-mail; Prism refuses anything else (400, the spec's
/// bad request), which would end the records rejected.
#[tokio::test]
async fn the_brevo_contacts_rules_pass_brevos_own_spec() {
    preset_keys();
    let prism = Prism::start("brevo/contacts.json");
    for (path, bad) in [
        (
            "contacts",
            json!({"email": "a@example.com", "listIds": "2"}),
        ),
        (
            "contacts/batch",
            json!({"contacts": {"email": "a@example.com"}}),
        ),
    ] {
        let refused = reqwest::Client::new()
            .post(format!("{}{path}", prism.base_url()))
            .header("api-key", PRESET_KEY)
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(
            refused.status().as_u16(),
            400,
            "{path}: prism must validate bodies"
        );
    }
    let preset = presets::find("brevo").unwrap();
    for rule in ["brevo-contacts", "brevo-contacts-update-only"] {
        let mut file: Value = serde_json::from_str(preset.text).unwrap();
        file["connections"][0]["base_url"] = json!(prism.base_url());
        file["rules"]
            .as_array_mut()
            .unwrap()
            .retain(|r| r["name"] == rule);
        let db = TestDb::new().await;
        apply::apply_file(&db.pool, &file.to_string(), Default::default())
            .await
            .unwrap();
        let contacts = (0..3).map(|i| {
            let payload = json!({"email": format!("c{i}@example.com"), "firstname": "Ada",
                                 "lastname": format!("L{i}"), "orders": i});
            NewDelivery::new(format!("c:{i}"), payload)
        });
        courier::enqueue::enqueue_many(&db.pool, rule, contacts.collect())
            .await
            .unwrap();
        let engine = engine(&db.pool, settings(&db.url));
        drive(&engine).await;
        let rows: Vec<(String, Option<String>)> = status_and_last_error(&db.pool).await;
        assert!(
            rows.iter().all(|(s, _)| s == "delivered"),
            "{rule}: {rows:?}"
        );
    }
}

/// The Klaviyo preset's erase operation into Prism validating Klaviyo's own
/// `request_profile_deletion` (POST /api/data-privacy-deletion-jobs): a person named by
/// e-mail, by phone, and by both (the call names them by one identity, as the spec's
/// description demands) is taken with the spec's 202, which courier reads `queued`; the
/// erase's own limits are the spec's.
#[tokio::test]
async fn the_klaviyo_presets_erase_passes_klaviyos_own_spec() {
    preset_keys();
    let spec = "request_profile_deletion.json";
    let preset = presets::find("klaviyo").unwrap();
    let mut file: Value = serde_json::from_str(preset.text).unwrap();
    assert_eq!(
        file["connections"][0]["erase"]["limits"],
        json!(spec_limits(spec)),
        "the erase's own limits"
    );
    let prism = Prism::start(&format!("klaviyo/prism/{spec}"));
    let api = format!("{}api/", prism.base_url());
    let refused = reqwest::Client::new()
        .post(format!("{api}data-privacy-deletion-jobs"))
        .header("authorization", format!("Klaviyo-API-Key {PRESET_KEY}"))
        .header("revision", "2026-07-15")
        .header("content-type", "application/vnd.api+json")
        .body(r#"{"data": {"type": "data-privacy-deletion-job", "attributes": {}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 422, "prism must validate bodies");
    file["connections"][0]["base_url"] = json!(api);
    file["rules"].as_array_mut().unwrap().truncate(1);
    let db = TestDb::new().await;
    apply::apply_file(&db.pool, &file.to_string(), Default::default())
        .await
        .unwrap();
    let engine = engine(&db.pool, erasing(&db.url));
    let people = [
        (Some("ann@example.com"), None),
        (None, Some("+15005550006")),
        (Some("bob@example.com"), Some("+15005550007")),
    ];
    for (email, phone) in people {
        let person = courier::erasure::Person {
            email: email.map(str::to_owned),
            phone: phone.map(str::to_owned),
            ..Default::default()
        };
        let id = erase(&engine, &person).await;
        let got = erased_part(&db.pool, id).await;
        assert_eq!(
            (got.0.as_str(), got.1),
            ("queued", Some(202)),
            "{email:?} {phone:?}: {got:?}"
        );
    }
}

/// The Brevo preset's erase operation into Prism validating Brevo's own `deleteContact`
/// (DELETE /contacts/{identifier}?identifierType=...): the person named by e-mail is
/// deleted with the spec's 204, read `erased`; an identifier type the spec does not list is
/// refused (the validator is on). The spec names 404 "Contact not found", which the preset
/// reads `unknown`.
#[tokio::test]
async fn the_brevo_presets_erase_passes_brevos_own_spec() {
    preset_keys();
    let prism = Prism::start("brevo/delete_contact.json");
    let refused = reqwest::Client::new()
        .delete(format!(
            "{}contacts/ann%40example.com?identifierType=email",
            prism.base_url()
        ))
        .header("api-key", PRESET_KEY)
        .send()
        .await
        .unwrap();
    // Prism answers a parameter the spec refuses with 400 (a body with 422).
    assert_eq!(
        refused.status().as_u16(),
        400,
        "prism must validate parameters"
    );
    let preset = presets::find("brevo").unwrap();
    let mut file: Value = serde_json::from_str(preset.text).unwrap();
    file["connections"][0]["base_url"] = json!(prism.base_url());
    file["rules"].as_array_mut().unwrap().truncate(1);
    let db = TestDb::new().await;
    apply::apply_file(&db.pool, &file.to_string(), Default::default())
        .await
        .unwrap();
    let engine = engine(&db.pool, erasing(&db.url));
    let person = courier::erasure::Person {
        email: Some("Ann@Example.com".into()),
        ..Default::default()
    };
    let id = erase(&engine, &person).await;
    let got = erased_part(&db.pool, id).await;
    assert_eq!((got.0.as_str(), got.1), ("erased", Some(204)), "{got:?}");
}
