//! Delivery through a target's asynchronous jobs: a submit leaves its records `accepted`,
//! the poller polls the job at a growing interval (a manual clock moves it; no test sleeps
//! for it) and settles each record as the job reports, against `courier target`'s
//! emulation of Klaviyo's profile bulk import.

use crate::common::*;
use chrono::Duration as Span;
use courier::{
    catalog::{self, NewRule},
    enqueue::{self, NewDelivery},
    poller::Poller,
};
use courier_target::jobs::{JobEnd, JobsConfig};
use serde_json::json;
use sqlx::PgPool;

/// Rule `profiles` on connection `shop`: Klaviyo's profile bulk import, 100 per job, a job
/// overdue `overdue_after` seconds after its submit.
async fn job_rule(pool: &PgPool, overdue_after: u32) {
    catalog::upsert_rule(
        pool,
        &NewRule {
            name: "profiles".into(),
            connection: "shop".into(),
            path: "api/profile-bulk-import-jobs".into(),
            batch_size: Some(100),
            max_attempts: Some(3),
            backoff_base_ms: Some(1_000),
            records_per_call: Some(100),
            request: Some(json!({
                "item": {"type": "profile", "attributes": "{{payload}}"},
                "body": {"data": {"type": "profile-bulk-import-job",
                                  "attributes": {"profiles": {"data": "{{records}}"}}}}
            })),
            job: Some(json!({
                "id": "/data/id",
                "poll": {"path": "api/profile-bulk-import-jobs/{id}",
                         "status": "/data/attributes/status",
                         "complete": ["complete"], "failed": ["cancelled"]},
                "errors": {"path": "api/profile-bulk-import-jobs/{id}/import-errors?page[size]=2",
                           "items": "/data", "next": "/links/next",
                           "record": {"pointer": {"pointer": "/attributes/source/pointer",
                                                  "prefix": "/data/attributes/profiles/data/"}},
                           "message": "/attributes/detail"},
                "first_poll_seconds": 1, "max_poll_seconds": 4,
                "overdue_after_seconds": overdue_after,
                "poll_budget": {"key": "shop:job-reads", "limits": ["100/s"]}
            })),
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

/// `n` profiles `p:{i}`; those whose index is in `invalid` carry `"invalid": true`.
fn profiles(n: usize, invalid: &[usize]) -> Vec<NewDelivery> {
    (0..n)
        .map(|i| {
            let mut p = json!({"email": format!("p{i}@example.com")});
            if invalid.contains(&i) {
                p["invalid"] = json!(true);
            }
            NewDelivery::new(format!("p:{i}"), p)
        })
        .collect()
}

/// A shop whose target's jobs end as `end`, at once.
async fn shop_ending(end: JobEnd) -> (crate::common::TestDb, courier_target::Target) {
    let (db, target) = shop(&[], 100, 1).await;
    target.set_jobs(JobsConfig {
        complete_after: std::time::Duration::ZERO,
        end,
        limited: false,
    });
    (db, target)
}

/// A shop whose target's jobs end as `end` (at once), the job rule, `records` enqueued and
/// submitted (the chain driven until its run ends): every record accepted in a job.
async fn submitted(
    end: JobEnd,
    records: Vec<NewDelivery>,
) -> (
    crate::common::TestDb,
    courier_target::Target,
    std::sync::Arc<courier::worker::Engine>,
) {
    let (db, target) = shop_ending(end).await;
    job_rule(&db.pool, 30).await;
    enqueue::enqueue_many(&db.pool, "profiles", records)
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    (db, target, engine)
}

async fn statuses(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT status, count(*) FROM deliveries GROUP BY status ORDER BY status")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn job_row(pool: &PgPool) -> (String, i32, i32, Option<String>) {
    sqlx::query_as("SELECT status, polls, poll_every_ms, last_said FROM target_jobs")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_job_leaves_its_records_accepted_until_it_reports_each_ones_fate() {
    let (db, target, engine) = submitted(JobEnd::Complete, profiles(10, &[2, 5, 7])).await;
    // The submit: one call, ten records the target has and has not yet judged.
    assert_eq!(statuses(&db.pool).await, [("accepted".into(), 10)]);
    assert_eq!(target.counters().requests, 1);
    let tagged: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ledger l JOIN target_jobs j ON j.id = l.target_job
         WHERE l.outcome = 'accepted'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(tagged, 10, "each accepted row names its job");
    assert_eq!(
        delivered(&db.pool).await,
        0,
        "nothing reads delivered before the target said so"
    );
    // Not due before its first poll.
    let poller = Poller::new(&engine);
    assert_eq!(poller.run_once().await.unwrap(), 0);
    engine.clock.advance(Span::seconds(1));
    assert_eq!(poller.run_once().await.unwrap(), 1);
    // Complete: three errors over two pages, each naming its record by a pointer.
    assert_eq!(
        statuses(&db.pool).await,
        [("delivered".into(), 7), ("rejected".into(), 3)]
    );
    assert_eq!(job_row(&db.pool).await.0, "complete");
    let rejected: Vec<(String, String)> = sqlx::query_as(
        "SELECT d.record_key, l.error FROM ledger l JOIN deliveries d ON d.id = l.delivery_id
         WHERE l.outcome = 'rejected' AND l.target_job IS NOT NULL ORDER BY d.id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        rejected,
        [
            ("p:2".into(), "profile 2 is invalid".into()),
            ("p:5".into(), "profile 5 is invalid".into()),
            ("p:7".into(), "profile 7 is invalid".into())
        ]
    );
    // The submit, one poll, two pages of errors; the reads from the poll budget.
    assert_eq!(target.counters().requests, 4);
    let calls: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(calls), 0)::bigint FROM budget_calls WHERE budget_key = 'shop:job-reads'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        calls, 3,
        "one poll and two pages of errors, from the poll budget"
    );
    assert_eq!(target.job_polls(), 1);
    // The target counted each valid profile once, when its job completed.
    let ids: Vec<(i64, String)> = sqlx::query_as("SELECT id, status FROM deliveries ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    for (id, status) in ids {
        let want = u32::from(status == "delivered");
        assert_eq!(
            target.accepted(&format!("courier-{id}")),
            want,
            "{id} {status}"
        );
    }
    // Settled once: a second pass finds nothing due.
    engine.clock.advance(Span::seconds(60));
    assert_eq!(poller.run_once().await.unwrap(), 0);
}

#[tokio::test]
async fn a_running_job_is_polled_ever_less_often_and_an_overdue_one_is_named() {
    let (db, _target, engine) = submitted(JobEnd::Never, profiles(4, &[])).await;
    let poller = Poller::new(&engine);
    // Waits of 1 s, then 2, 4, 4 (the most): the job is due only when each has passed.
    let mut waited = Vec::new();
    for _ in 0..4 {
        let every = job_row(&db.pool).await.2;
        engine
            .clock
            .advance(Span::milliseconds(i64::from(every) - 1));
        assert_eq!(poller.run_once().await.unwrap(), 0, "not due yet");
        engine.clock.advance(Span::milliseconds(1));
        assert_eq!(poller.run_once().await.unwrap(), 1);
        waited.push(every);
    }
    assert_eq!(waited, [1000, 2000, 4000, 4000]);
    let (status, polls, _, said) = job_row(&db.pool).await;
    assert_eq!(
        (status.as_str(), polls, said.as_deref()),
        ("submitted", 4, Some("processing"))
    );
    let shown = courier::jobs::in_flight(&db.pool).await.unwrap();
    assert_eq!((shown[0].jobs, shown[0].records), (1, 4));
    // Past its bound: overdue, named, its records left accepted (sending them again could
    // duplicate them), and polled no more.
    engine.clock.advance(Span::seconds(30));
    assert_eq!(poller.run_once().await.unwrap(), 1);
    assert_eq!(job_row(&db.pool).await.0, "overdue");
    assert_eq!(statuses(&db.pool).await, [("accepted".into(), 4)]);
    let shown = courier::jobs::in_flight(&db.pool).await.unwrap();
    assert_eq!((shown[0].jobs, shown[0].overdue), (0, 1));
    engine.clock.advance(Span::seconds(60));
    assert_eq!(poller.run_once().await.unwrap(), 0);
}

#[tokio::test]
async fn a_cancelled_job_sends_its_records_again() {
    let (db, target, engine) = submitted(JobEnd::Cancelled, profiles(3, &[])).await;
    engine.clock.advance(Span::seconds(1));
    assert_eq!(Poller::new(&engine).run_once().await.unwrap(), 1);
    assert_eq!(job_row(&db.pool).await.0, "failed");
    // Failed, due again after their backoff, and submitted again then, as a new job.
    assert_eq!(statuses(&db.pool).await, [("pending".into(), 3)]);
    let outcomes: Vec<String> =
        sqlx::query_scalar("SELECT outcome FROM ledger WHERE target_job IS NOT NULL ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        outcomes,
        [
            "accepted", "accepted", "accepted", "failed", "failed", "failed"
        ]
    );
    target.set_jobs(JobsConfig::default());
    engine.clock.advance(Span::seconds(5));
    drive(&engine).await;
    assert_eq!(statuses(&db.pool).await, [("accepted".into(), 3)]);
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM target_jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(jobs, 2);
}

#[tokio::test]
async fn a_submit_whose_answer_names_no_job_accepts_nothing() {
    let (db, _target) = shop(&[], 100, 1).await;
    // The generic endpoint answers 200 without a job: nothing can be polled.
    catalog::upsert_rule(
        &db.pool,
        &NewRule {
            name: "profiles".into(),
            connection: "shop".into(),
            path: "not-a-job/".into(),
            records_per_call: Some(10),
            max_attempts: Some(3),
            job: Some(json!({"id": "/data/id",
                             "poll": {"path": "x/{id}", "status": "/s", "complete": ["done"],
                                      "failed": []}})),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    enqueue::enqueue_many(&db.pool, "profiles", profiles(2, &[]))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(statuses(&db.pool).await, [("pending".into(), 2)]);
    let error: String =
        sqlx::query_scalar("SELECT error FROM ledger WHERE outcome = 'failed' LIMIT 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(error.contains("names no job id at \"/data/id\""), "{error}");
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM target_jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(jobs, 0);
}

#[tokio::test]
async fn a_job_whose_poller_died_is_taken_over_when_its_lease_lapses_and_settled_once() {
    let (db, _target, engine) = submitted(JobEnd::Complete, profiles(5, &[1])).await;
    engine.clock.advance(Span::seconds(1));
    // A process leased the job and was killed before it wrote anything of it.
    let now = engine.clock.now();
    let window = (now, now + Span::minutes(2));
    let leased = courier::jobs::lease_due(&db.pool, "gone/1", window, Span::seconds(30), 10)
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);
    let poller = Poller::new(&engine);
    assert_eq!(
        poller.run_once().await.unwrap(),
        0,
        "leased to another process"
    );
    assert_eq!(statuses(&db.pool).await, [("accepted".into(), 5)]);
    // Its lease lapses: this process takes the job over and settles it.
    engine.clock.advance(Span::minutes(2) + Span::seconds(1));
    assert_eq!(poller.run_once().await.unwrap(), 1);
    assert_eq!(
        statuses(&db.pool).await,
        [("delivered".into(), 4), ("rejected".into(), 1)]
    );
    // The dead process's lease is gone with it: it could settle nothing now.
    let mut tx = db.pool.begin().await.unwrap();
    let ended = courier::jobs::end(
        &mut tx,
        leased[0].id,
        "gone/1",
        courier::jobs::Ended::Complete,
        "complete",
        None,
        engine.clock.now(),
    )
    .await
    .unwrap();
    assert!(!ended);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger WHERE target_job IS NOT NULL")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        rows, 10,
        "five accepted rows and five outcomes: each record settled once"
    );
}

/// Rule `contacts` on connection `shop`: Salesforce Bulk API 2.0 ingest, opened, sent as
/// CSV and closed, its failed rows read as CSV by the external id.
async fn ingest_rule(pool: &PgPool) {
    catalog::upsert_rule(
        pool,
        &NewRule {
            name: "contacts".into(),
            connection: "shop".into(),
            path: "services/data/v62.0/jobs/ingest/{id}/batches".into(),
            batch_size: Some(100),
            records_per_call: Some(100),
            request: Some(json!({"method": "PUT", "csv": ["External_Id__c", "Email", "LastName"]})),
            job: Some(json!({
                "open": {"path": "services/data/v62.0/jobs/ingest",
                         "body": {"object": "Contact", "externalIdFieldName": "External_Id__c",
                                  "operation": "upsert", "contentType": "CSV"}},
                "close": {"method": "PATCH", "path": "services/data/v62.0/jobs/ingest/{id}",
                          "body": {"state": "UploadComplete"}},
                "id": "/id",
                "poll": {"path": "services/data/v62.0/jobs/ingest/{id}", "status": "/state",
                         "complete": ["JobComplete"], "failed": ["Failed", "Aborted"]},
                "errors": {"path": "services/data/v62.0/jobs/ingest/{id}/failedResults/",
                           "format": "csv", "items": "",
                           "record": {"key": {"error": "/External_Id__c", "record": "/External_Id__c"}},
                           "message": "/sf__Error"},
                "first_poll_seconds": 1, "max_poll_seconds": 4
            })),
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn an_ingest_job_is_opened_filled_with_csv_closed_and_its_failed_rows_read_by_key() {
    let (db, target) = shop_ending(JobEnd::Complete).await;
    ingest_rule(&db.pool).await;
    // c2 has no last name (Salesforce fails it); c4 has neither a last name nor the
    // external id its failed row would be named by.
    let contacts = (0..6).map(|i| {
        let mut p = json!({"External_Id__c": format!("c{i}"), "Email": format!("c{i}@example.com"),
                           "LastName": format!("Customer, \"{i}\"")});
        match i {
            2 => p["LastName"] = json!(""),
            4 => p = json!({"Email": "c4@example.com", "LastName": ""}),
            _ => {}
        }
        NewDelivery::new(format!("c:{i}"), p)
    });
    enqueue::enqueue_many(&db.pool, "contacts", contacts.collect())
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    // Three calls: open, the CSV upload into the job the open named, close.
    let calls: Vec<(String, String)> = target
        .requests()
        .iter()
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect();
    let job = "/services/data/v62.0/jobs/ingest/750x00000000001";
    assert_eq!(
        calls,
        [
            ("POST".into(), "/services/data/v62.0/jobs/ingest".into()),
            ("PUT".into(), format!("{job}/batches")),
            ("PATCH".into(), job.into()),
        ]
    );
    let upload = &target.requests()[1];
    assert_eq!(upload.headers["content-type"], "text/csv");
    let csv = upload.body.as_str().unwrap();
    assert!(
        csv.starts_with(
            "External_Id__c,Email,LastName\nc0,c0@example.com,\"Customer, \"\"0\"\"\"\n"
        ),
        "{csv}"
    );
    assert_eq!(statuses(&db.pool).await, [("accepted".into(), 6)]);
    let counted: i64 = sqlx::query_scalar("SELECT COALESCE(sum(calls), 0) FROM budget_calls")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(counted, 3, "the budget counts each call of the submit");
    engine.clock.advance(Span::seconds(1));
    assert_eq!(Poller::new(&engine).run_once().await.unwrap(), 1);
    let fates: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT record_key, status, last_error FROM deliveries ORDER BY record_key")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let fate = |k: &str| fates.iter().find(|f| f.0 == k).unwrap();
    assert_eq!(
        fates.iter().filter(|f| f.1 == "delivered").count(),
        4,
        "{fates:?}"
    );
    assert_eq!(fate("c:2").1, "rejected");
    assert!(
        fate("c:2")
            .2
            .as_deref()
            .unwrap()
            .starts_with("REQUIRED_FIELD_MISSING"),
        "{fates:?}"
    );
    // Its failed row names a key no record has alone: never read as delivered.
    assert_eq!(fate("c:4").1, "rejected");
    assert!(
        fate("c:4")
            .2
            .as_deref()
            .unwrap()
            .contains("its fate is unknown"),
        "{fates:?}"
    );
    assert_eq!(target.accepted_log().len(), 4, "the target holds the four");
}

#[tokio::test]
async fn a_job_leased_to_a_process_found_dead_is_taken_over_before_its_lease_lapses() {
    let (db, _target, engine) = submitted(JobEnd::Complete, profiles(3, &[])).await;
    engine.clock.advance(Span::seconds(1));
    let now = engine.clock.now();
    // A process that beat, leased the job, and beat no more.
    courier::workers::beat(&db.pool, "gone/2", now, None, None)
        .await
        .unwrap();
    let window = (now, now + Span::minutes(2));
    let dead_after = Span::from_std(settings(&db.url).worker_dead_after).unwrap();
    let leased = courier::jobs::lease_due(&db.pool, "gone/2", window, dead_after, 10)
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);
    let poller = Poller::new(&engine);
    assert_eq!(poller.run_once().await.unwrap(), 0, "its owner beats still");
    // Past the rescuer's window without a beat: dead, its lease still running.
    engine.clock.advance(dead_after + Span::seconds(1));
    assert_eq!(poller.run_once().await.unwrap(), 1);
    assert_eq!(statuses(&db.pool).await, [("delivered".into(), 3)]);
}

/// Rule `rule` of preset `preset` into `target`, its job's first poll after a second and
/// its `errors` patched with `errors` (each field given replaced).
async fn preset_job(
    pool: &PgPool,
    target: &courier_target::Target,
    (preset, rule): (&str, &str),
    errors: serde_json::Value,
) {
    let preset = courier::presets::find(preset).unwrap();
    let mut file = preset_rule(preset, rule, &target.url());
    let job = &mut file["rules"][0]["job"];
    for (field, value) in errors.as_object().unwrap() {
        job["errors"][field] = value.clone();
    }
    courier::apply::apply_file(pool, &file.to_string(), Default::default())
        .await
        .unwrap();
}

/// The Brevo preset's contacts import, into `target`, its report files allowed from
/// `origins` and named at `url` in the process's answer.
async fn brevo_import(pool: &PgPool, target: &courier_target::Target, origins: &[&str], url: &str) {
    let errors = json!({"origins": origins, "url": url});
    preset_job(pool, target, ("brevo", "brevo-contacts-import"), errors).await;
}

#[tokio::test]
async fn a_brevo_import_reads_its_report_from_the_allowed_file_host_without_the_key() {
    let (db, target) = shop_ending(JobEnd::Complete).await;
    let files = target.url().replace("127.0.0.1", "localhost");
    let files = files.trim_end_matches('/');
    // First allowed only from Brevo's own hosts: the report on another origin is not read.
    brevo_import(
        &db.pool,
        &target,
        &["https://*.brevo.com"],
        "/info/import/invalid_emails",
    )
    .await;
    enqueue::enqueue_many(&db.pool, "brevo-contacts-import", profiles(5, &[3]))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(statuses(&db.pool).await, [("accepted".into(), 5)]);
    let poller = Poller::new(&engine);
    engine.clock.advance(Span::seconds(1));
    assert_eq!(poller.run_once().await.unwrap(), 1);
    let (status, _, _, said) = job_row(&db.pool).await;
    assert_eq!(
        status, "submitted",
        "polled again, nothing read as delivered"
    );
    let said = said.unwrap();
    assert!(
        said.contains(&format!(
            "errors file is at {files}, an origin errors.origins does not name"
        )),
        "{said}"
    );
    assert_eq!(statuses(&db.pool).await, [("accepted".into(), 5)]);
    // The operator allows the file host: the report is read there, without the key.
    brevo_import(&db.pool, &target, &[files], "/info/import/invalid_emails").await;
    engine.clock.advance(Span::seconds(2));
    assert_eq!(poller.run_once().await.unwrap(), 1);
    assert_eq!(
        statuses(&db.pool).await,
        [("delivered".into(), 4), ("rejected".into(), 1)]
    );
    let rejected: String =
        sqlx::query_scalar("SELECT record_key FROM deliveries WHERE status = 'rejected'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(rejected, "p:3");
    let requests = target.requests();
    let report: Vec<_> = requests
        .iter()
        .filter(|r| r.path.ends_with("/invalid_emails.csv"))
        .collect();
    assert_eq!(report.len(), 1, "the report, read once");
    assert_eq!(
        report[0].headers["host"],
        files.trim_start_matches("http://")
    );
    assert!(
        !report[0].headers.contains_key("api-key"),
        "no credential goes to the file host: {:?}",
        report[0].headers
    );
    assert!(
        requests
            .iter()
            .filter(|r| !r.path.ends_with(".csv"))
            .all(|r| r.headers.get("api-key").map(String::as_str) == Some(PRESET_KEY)),
        "the API's calls carry the key"
    );
}

#[tokio::test]
async fn a_complete_job_that_names_no_errors_file_leaves_its_records_unconfirmed() {
    let (db, target) = shop_ending(JobEnd::Complete).await;
    let files = target.url().replace("127.0.0.1", "localhost");
    // The rule looks for the report where the answer has none.
    brevo_import(
        &db.pool,
        &target,
        &[files.trim_end_matches('/')],
        "/info/import/nowhere",
    )
    .await;
    enqueue::enqueue_many(&db.pool, "brevo-contacts-import", profiles(3, &[1]))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    engine.clock.advance(Span::seconds(1));
    assert_eq!(Poller::new(&engine).run_once().await.unwrap(), 1);
    assert_eq!(statuses(&db.pool).await, [("unconfirmed".into(), 3)]);
    let error: String =
        sqlx::query_scalar("SELECT error FROM ledger WHERE outcome = 'unconfirmed' LIMIT 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        error.contains("names no errors file at \"/info/import/nowhere\""),
        "{error}"
    );
}

#[tokio::test]
async fn a_hubspot_import_uploads_a_form_and_reads_its_errors_page_by_page_by_cursor() {
    let (db, target) = shop_ending(JobEnd::Complete).await;
    let path = "crm/v3/imports/{id}/errors?includeRowData=true&includeErrorMessage=true&limit=2";
    let rule = ("hubspot", "hubspot-contacts-import");
    preset_job(&db.pool, &target, rule, json!({"path": path})).await;
    // Three of seven without a last name: HubSpot's emulation fails their rows.
    let contacts = (0..7).map(|i| {
        let last = if [1, 4, 5].contains(&i) {
            String::new()
        } else {
            format!("L{i}")
        };
        let payload =
            json!({"email": format!("c{i}@example.com"), "firstname": "Ada", "lastname": last});
        NewDelivery::new(format!("c:{i}"), payload)
    });
    enqueue::enqueue_many(&db.pool, "hubspot-contacts-import", contacts.collect())
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(statuses(&db.pool).await, [("accepted".into(), 7)]);
    let upload = &target.requests()[0];
    assert!(
        upload.headers["content-type"].starts_with("multipart/form-data; boundary="),
        "{:?}",
        upload.headers
    );
    engine.clock.advance(Span::seconds(1));
    assert_eq!(Poller::new(&engine).run_once().await.unwrap(), 1);
    let fates: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT record_key, status, last_error FROM deliveries ORDER BY record_key")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let rejected: Vec<&str> = fates
        .iter()
        .filter(|f| f.1 == "rejected")
        .map(|f| f.0.as_str())
        .collect();
    assert_eq!(rejected, ["c:1", "c:4", "c:5"], "{fates:?}");
    assert!(
        fates
            .iter()
            .all(|f| f.1 != "rejected" || f.2.as_deref().unwrap().contains("has no lastname"))
    );
    // The errors in two pages of two, the second asked for by the first's cursor.
    let pages: Vec<String> = target
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/errors"))
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(pages.len(), 2, "{pages:?}");
    assert_eq!(target.accepted_log().len(), 4, "the target holds the four");
}

#[tokio::test]
async fn a_job_whose_upload_fails_is_aborted_and_one_with_nothing_to_send_is_never_opened() {
    let (db, target) = shop_ending(JobEnd::Complete).await;
    let ingest = "services/data/v62.0/jobs/ingest";
    let rule = |name: &str, request: serde_json::Value| NewRule {
        name: name.into(),
        connection: "shop".into(),
        path: format!("{ingest}/{{id}}/batches"),
        batch_size: Some(100),
        max_attempts: Some(1),
        records_per_call: Some(100),
        request: Some(request),
        job: Some(json!({
            "open": {"path": ingest, "body": {"object": "Contact", "contentType": "CSV"}},
            "close": {"method": "PATCH", "path": format!("{ingest}/{{id}}"),
                      "body": {"state": "UploadComplete"}},
            "abort": {"method": "PATCH", "path": format!("{ingest}/{{id}}"),
                      "body": {"state": "Aborted"}},
            "id": "/id",
            "poll": {"path": format!("{ingest}/{{id}}"), "status": "/state",
                     "complete": ["JobComplete"], "failed": ["Failed", "Aborted"]}
        })),
        ..Default::default()
    };
    // The target refuses every upload (not text/csv): each job opened is aborted, as the
    // call is split down to single records.
    let refused =
        json!({"method": "PUT", "csv": ["Email"], "content_type": "application/octet-stream"});
    catalog::upsert_rule(&db.pool, &rule("refused", refused))
        .await
        .unwrap();
    let contacts =
        (0..2).map(|i| NewDelivery::new(format!("r:{i}"), json!({"Email": format!("r{i}@x.io")})));
    enqueue::enqueue_many(&db.pool, "refused", contacts.collect())
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(statuses(&db.pool).await, [("rejected".into(), 2)]);
    let calls: Vec<(String, String, serde_json::Value)> = target
        .requests()
        .iter()
        .map(|r| (r.method.clone(), r.path.clone(), r.body.clone()))
        .collect();
    let opened = calls.iter().filter(|c| c.0 == "POST").count();
    let aborted: Vec<&String> = calls
        .iter()
        .filter(|c| c.0 == "PATCH" && c.2["state"] == "Aborted")
        .map(|c| &c.1)
        .collect();
    assert_eq!(opened, 3, "the call of two, then each half: {calls:?}");
    assert_eq!(
        aborted.len(),
        opened,
        "each job opened is aborted: {calls:?}"
    );
    assert!(
        calls.iter().all(|c| c.2["state"] != "UploadComplete"),
        "none closed"
    );
    // A call whose every record is refused before sending opens no job at all.
    let before = target.requests().len();
    let nested = json!({"method": "PUT", "csv": ["Email"]});
    catalog::upsert_rule(&db.pool, &rule("nested", nested))
        .await
        .unwrap();
    let bad = (0..2).map(|i| NewDelivery::new(format!("n:{i}"), json!({"Email": {"nested": i}})));
    enqueue::enqueue_many(&db.pool, "nested", bad.collect())
        .await
        .unwrap();
    engine.clock.advance(Span::seconds(1));
    drive(&engine).await;
    assert_eq!(statuses(&db.pool).await, [("rejected".into(), 4)]);
    assert_eq!(
        target.requests().len(),
        before,
        "no request for records refused before sending"
    );
}

#[tokio::test]
async fn every_presets_job_that_is_cancelled_sends_again_and_one_that_never_ends_goes_overdue() {
    let job_rules: Vec<(&str, String)> = courier::presets::PRESETS
        .iter()
        .flat_map(|p| {
            let file: serde_json::Value = serde_json::from_str(p.text).unwrap();
            let rules = file["rules"].as_array().unwrap().clone();
            rules
                .into_iter()
                .filter(|r| r["job"].is_object())
                .map(move |r| (p.name, r["name"].as_str().unwrap().to_owned()))
        })
        .collect();
    assert!(job_rules.len() >= 4, "{job_rules:?}");
    let payload = |i: usize| {
        json!({"email": format!("c{i}@example.com"), "External_Id__c": format!("c{i}"),
               "Email": format!("c{i}@example.com"), "LastName": "L", "lastname": "L",
               "firstname": "Ada"})
    };
    for (preset, rule) in &job_rules {
        for end in [JobEnd::Cancelled, JobEnd::Never] {
            let (db, target) = shop_ending(end).await;
            preset_job(&db.pool, &target, (preset, rule), json!({})).await;
            let records = (0..3).map(|i| NewDelivery::new(format!("c:{i}"), payload(i)));
            enqueue::enqueue_many(&db.pool, rule, records.collect())
                .await
                .unwrap();
            let engine = engine(&db.pool, settings(&db.url));
            drive(&engine).await;
            assert_eq!(statuses(&db.pool).await, [("accepted".into(), 3)], "{rule}");
            let poller = Poller::new(&engine);
            engine.clock.advance(Span::seconds(1));
            assert_eq!(poller.run_once().await.unwrap(), 1, "{rule} {end:?}");
            let (status, _, every, said) = job_row(&db.pool).await;
            match end {
                // The vendor's cancelled state is a failure: every record due again.
                JobEnd::Cancelled => {
                    assert_eq!(status, "failed", "{rule}: {said:?}");
                    assert_eq!(statuses(&db.pool).await, [("pending".into(), 3)], "{rule}");
                }
                // Still running, polled later each time, overdue past the rule's bound.
                _ => {
                    assert_eq!(status, "submitted", "{rule}: {said:?}");
                    assert_eq!(every, 2000, "{rule}: the wait doubles");
                    let bound: i64 = sqlx::query_scalar(
                        "SELECT (job->>'overdue_after_seconds')::bigint FROM rules",
                    )
                    .fetch_one(&db.pool)
                    .await
                    .unwrap();
                    engine.clock.advance(Span::seconds(bound));
                    assert_eq!(poller.run_once().await.unwrap(), 1, "{rule}");
                    assert_eq!(job_row(&db.pool).await.0, "overdue", "{rule}");
                    assert_eq!(statuses(&db.pool).await, [("accepted".into(), 3)], "{rule}");
                }
            }
        }
    }
}

#[tokio::test]
async fn a_job_named_by_its_answers_location_is_polled_there() {
    // A target answering its submit 202 with the job's status monitor in Location.
    let target = Server::start("127.0.0.1", |s| {
        match (s.head.split(' ').next().unwrap_or(""), s.path.as_str()) {
            ("POST", "/jobs") => answer("202 Accepted", "Location: /jobs/j-42?v=1\r\n", ""),
            ("GET", "/jobs/j-42") => answer("200 OK", "", r#"{"state": "done"}"#),
            _ => answer("404 Not Found", "", "{}"),
        }
    })
    .await;
    let db = TestDb::new().await;
    let shop = catalog::NewConnection {
        name: "shop".into(),
        writer: "http_json".into(),
        base_url: target.url.clone(),
        ..Default::default()
    };
    catalog::upsert_connection(&db.pool, &shop).await.unwrap();
    catalog::upsert_rule(
        &db.pool,
        &NewRule {
            name: "located".into(),
            connection: "shop".into(),
            path: "jobs".into(),
            records_per_call: Some(10),
            job: Some(json!({"id": "Location",
                             "poll": {"path": "jobs/{id}", "status": "/state",
                                      "complete": ["done"], "failed": []},
                             "first_poll_seconds": 1})),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    enqueue::enqueue_many(&db.pool, "located", profiles(2, &[]))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    let id: String = sqlx::query_scalar("SELECT target_id FROM target_jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(id, "j-42");
    engine.clock.advance(Span::seconds(1));
    assert_eq!(Poller::new(&engine).run_once().await.unwrap(), 1);
    assert_eq!(statuses(&db.pool).await, [("delivered".into(), 2)]);
}

/// A rule whose job at `target` lists its errors by a `next` cursor, each error naming a
/// record by its payload's `email`.
async fn listed_job(pool: &PgPool, target: &str) {
    let shop = catalog::NewConnection {
        name: "shop".into(),
        writer: "http_json".into(),
        base_url: target.into(),
        ..Default::default()
    };
    catalog::upsert_connection(pool, &shop).await.unwrap();
    catalog::upsert_rule(
        pool,
        &NewRule {
            name: "listed".into(),
            connection: "shop".into(),
            path: "jobs".into(),
            records_per_call: Some(10),
            job: Some(json!({"id": "/id",
                             "poll": {"path": "jobs/{id}", "status": "/state",
                                      "complete": ["done"], "failed": []},
                             "errors": {"path": "jobs/{id}/errors", "items": "/results",
                                        "next": "/next", "cursor": "after",
                                        "record": {"key": {"error": "/email", "record": "/email"}},
                                        "message": "/why"},
                             "first_poll_seconds": 1, "max_poll_seconds": 10})),
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

/// A listing of errors that never ends (every page links a new next page) reads at most a
/// page per record and one more, then ends the job with the records no error read names
/// `unconfirmed`, the reason said; it is never listed again. One whose next page is one
/// already read ends there, read whole.
#[tokio::test]
async fn a_listing_of_errors_is_bounded_by_the_records_it_can_name() {
    for endless in [true, false] {
        let pages = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = pages.clone();
        let target = Server::start("127.0.0.1", move |s| {
            match (s.head.split(' ').next().unwrap_or(""), s.path.as_str()) {
                ("POST", "/jobs") => answer("202 Accepted", "", r#"{"id": "j-1"}"#),
                ("GET", "/jobs/j-1") => answer("200 OK", "", r#"{"state": "done"}"#),
                ("GET", path) if path.starts_with("/jobs/j-1/errors") => {
                    let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    // The same error again and again, each page linking a new next one, or
                    // back to the second page.
                    let next = if endless { n + 1 } else { 1 };
                    answer(
                        "200 OK",
                        "",
                        &format!(
                            r#"{{"results": [{{"email": "p0@example.com", "why": "bad"}}], "next": "c{next}"}}"#
                        ),
                    )
                }
                _ => answer("404 Not Found", "", "{}"),
            }
        })
        .await;
        let db = TestDb::new().await;
        listed_job(&db.pool, &target.url).await;
        enqueue::enqueue_many(&db.pool, "listed", profiles(5, &[]))
            .await
            .unwrap();
        let engine = engine(&db.pool, settings(&db.url));
        drive(&engine).await;
        for _ in 0..3 {
            engine.clock.advance(Span::seconds(120));
            Poller::new(&engine).run_once().await.unwrap();
        }
        let read = pages.load(std::sync::atomic::Ordering::SeqCst);
        let got = statuses(&db.pool).await;
        if endless {
            // Five records: at most six pages, read once.
            assert_eq!(read, 6, "pages read");
            assert_eq!(got, [("rejected".into(), 1), ("unconfirmed".into(), 4)]);
            let why: String = sqlx::query_scalar(
                "SELECT error FROM ledger WHERE outcome = 'unconfirmed' LIMIT 1",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap();
            assert!(why.contains("6 errors for its 5 records"), "{why}");
        } else {
            assert_eq!(read, 2, "pages read");
            assert_eq!(got, [("delivered".into(), 4), ("rejected".into(), 1)]);
        }
    }
}

/// A poll is a call like a delivery call ([`courier::paced`]): a run of 5xx answers opens
/// the connection's circuit, and no job is polled while it is open; a poll answered with
/// nothing left of the budget, or with a 429, blocks the budget for every process. A page
/// of a complete job's errors is heard the same way: its 429 or its spent budget blocks
/// the budget, and the page due within the block is not read.
#[tokio::test]
async fn a_poll_is_heard_as_a_delivery_call_is() {
    for (kind, mode) in [
        ("poll", "5xx"),
        ("poll", "spent"),
        ("poll", "429"),
        ("errors page", "spent"),
        ("errors page", "429"),
    ] {
        let (db, polled) = heard(kind, mode).await;
        let engine = engine(&db.pool, settings(&db.url));
        let threshold = engine.settings.breaker.failure_threshold as usize;
        if mode == "5xx" {
            let state: String = sqlx::query_scalar("SELECT state FROM circuits")
                .fetch_one(&db.pool)
                .await
                .unwrap();
            assert_eq!(state, "open", "{kind} {mode}");
            assert_eq!(
                polled, threshold,
                "{mode}: no poll while the circuit is open"
            );
            let said: String = sqlx::query_scalar("SELECT last_said FROM target_jobs")
                .fetch_one(&db.pool)
                .await
                .unwrap();
            assert!(said.contains("circuit is open"), "{said}");
        } else {
            let raw: String = sqlx::query_scalar("SELECT retry_after_raw FROM connection_blocks")
                .fetch_one(&db.pool)
                .await
                .unwrap();
            let want = if mode == "spent" { "remaining 0" } else { "30" };
            assert!(raw.starts_with(want), "{kind} {mode}: {raw}");
            // The block holds the budget: the call due within it is not made.
            assert_eq!(polled, 1, "{kind} {mode}");
        }
        // An errors page that says the budget is spent is read all the same (no errors:
        // both delivered); a refused one leaves the records accepted.
        let settled = match (kind, mode) {
            ("errors page", "spent") => "delivered",
            _ => "accepted",
        };
        assert_eq!(
            statuses(&db.pool).await,
            [(settled.into(), 2)],
            "{kind} {mode}"
        );
    }
}

/// A job of two records whose `kind` of call (its poll, or a page of its errors) the
/// target answers as `mode` says (5xx, its budget spent, 429); polled as often as a run of
/// 5xx needs to open the circuit, then once more 11 s later. Returns the database and how
/// many such calls the target saw.
async fn heard(kind: &'static str, mode: &'static str) -> (crate::common::TestDb, usize) {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let target = Server::start("127.0.0.1", move |s| {
        let refusal = || match mode {
            "5xx" => answer("503 Service Unavailable", "", "{}"),
            "spent" => answer(
                "200 OK",
                "RateLimit-Policy: \"default\";q=10;w=60\r\nRateLimit: \"default\";r=0;t=60\r\n",
                r#"{"state": "running", "results": []}"#,
            ),
            _ => answer("429 Too Many Requests", "Retry-After: 30\r\n", "{}"),
        };
        let path = s.path.as_str();
        match (s.head.split(' ').next().unwrap_or(""), kind) {
            ("POST", _) if path == "/jobs" => answer("202 Accepted", "", r#"{"id": "j-1"}"#),
            ("GET", "poll") if path == "/jobs/j-1" => {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                refusal()
            }
            ("GET", _) if path == "/jobs/j-1" => answer("200 OK", "", r#"{"state": "done"}"#),
            ("GET", "errors page") if path.starts_with("/jobs/j-1/errors") => {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                refusal()
            }
            _ => answer("404 Not Found", "", "{}"),
        }
    })
    .await;
    let db = TestDb::new().await;
    listed_job(&db.pool, &target.url).await;
    enqueue::enqueue_many(&db.pool, "listed", profiles(2, &[]))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    let threshold = engine.settings.breaker.failure_threshold as usize;
    let made = if mode == "5xx" { threshold } else { 1 };
    for _ in 0..made {
        engine.clock.advance(Span::seconds(120));
        Poller::new(&engine).run_once().await.unwrap();
    }
    // The job falls due again within the circuit's cooldown (30 s) and the block (30 s).
    engine.clock.advance(Span::seconds(11));
    Poller::new(&engine).run_once().await.unwrap();
    let n = calls.load(std::sync::atomic::Ordering::SeqCst);
    (db, n)
}
