//! Every ready target's rules through a real worker (dispatcher, queue, chain jobs) and
//! PostgreSQL into `courier target`, which answers each vendor's batch endpoint as the vendor does (HubSpot's keyed
//! 207, Brevo's successIds and failureIds, Braze's indexed errors, Customer.io's
//! batch_index, Salesforce's positional success, Mailchimp's errors by e-mail, answers
//! without a body): a record the target refuses ends as that record's ledger row, the
//! others delivered once.

use std::sync::Arc;

use crate::common::*;
use courier::{
    catalog,
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
                "properties": {"value": i}
            });
            if one_invalid && i == 3 {
                p["invalid"] = json!(true);
            }
            NewDelivery::new(format!("{rule}:{i}"), p)
        })
        .collect()
}

#[tokio::test]
async fn every_presets_rules_deliver_and_refused_records_end_rejected() {
    preset_keys();
    let mut cells = Vec::new();
    for preset in PRESETS {
        for rule in preset.rules() {
            let db = TestDb::new().await;
            let target = Target::start(0).await.unwrap();
            let mut file: serde_json::Value = serde_json::from_str(preset.text).unwrap();
            file["connections"][0]["base_url"] = json!(target.url());
            if file["connections"][0]["auth"]["kind"] == "oauth" {
                file["connections"][0]["auth"]["token_url"] =
                    json!(format!("{}services/oauth2/token", target.url()));
            }
            file["rules"]
                .as_array_mut()
                .unwrap()
                .retain(|r| r["name"] == rule.as_str());
            catalog::apply_file(&db.pool, &file.to_string(), Default::default())
                .await
                .unwrap_or_else(|e| panic!("{}/{rule}: {e}", preset.name));
            // Targets that answer records one by one, or accept a job for later, name no
            // refused record.
            let per_record = file["rules"][0]["answer"].is_object();
            courier::enqueue::enqueue_many(&db.pool, &rule, records(&rule, per_record))
                .await
                .unwrap();
            // A real worker: the dispatcher, the queue, the chain jobs.
            let engine = Arc::new(Engine::new(db.pool.clone(), settings(&db.url)));
            let worker = tokio::spawn(worker::run(engine.clone()));
            let pool = db.pool.clone();
            eventually("nothing pending", || {
                let pool = pool.clone();
                async move {
                    let pending: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM deliveries WHERE status = 'pending'",
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
    assert_eq!(cells.len(), 10, "every rule of every preset ran");
}
