//! Erasure at each vendor the presets feed, over real HTTP on loopback: a person written
//! through the vendor's own upsert endpoint is gone after its delete call (and its lookup,
//! where the vendor deletes by its own id), the delete answers as the vendor does, an
//! unknown person gets the vendor's answer, and Mailchimp refuses an address it deleted
//! permanently. How each vendor answers is `presets/<name>.target.json`'s `erase`.

use courier_target::{Target, TargetConfig, WorkspaceConfig};
use md5::{Digest, Md5};
use serde_json::{Value, json};

const TOKEN: &str = "t0ken";

async fn start() -> Target {
    Target::start_with(TargetConfig {
        workspaces: vec![WorkspaceConfig::new("shop", TOKEN)],
        ..TargetConfig::default()
    })
    .await
    .unwrap()
}

/// One call: its status, its body (null when it has none) and whether it had one.
async fn call(t: &Target, method: &str, path: &str, body: Option<Value>) -> (u16, Value, bool) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let url = match path.starts_with("http") {
        true => path.to_owned(),
        false => format!("{}{path}", t.url()),
    };
    let mut r = reqwest::Client::new()
        .request(method, url)
        .header("authorization", format!("Token {TOKEN}"));
    if let Some(body) = body {
        r = r.json(&body);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let bytes = r.bytes().await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, body, !bytes.is_empty())
}

fn md5_hex(s: &str) -> String {
    Md5::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn hubspot_gdpr_delete_removes_the_contact_and_answers_204_for_anyone() {
    let t = start().await;
    let upsert = json!({"inputs": [{"idProperty": "email", "id": "Ann@X.io",
                                    "properties": {"email": "Ann@X.io"}}]});
    let (status, _, _) = call(
        &t,
        "POST",
        "crm/v3/objects/contacts/batch/upsert",
        Some(upsert),
    )
    .await;
    assert_eq!(status, 200);
    assert!(t.contacts("hubspot").contains_key("ann@x.io"));
    let delete = json!({"objectId": "ann@x.io", "idProperty": "email"});
    let path = "crm/v3/objects/contacts/gdpr-delete";
    assert_eq!(
        call(&t, "POST", path, Some(delete.clone())).await,
        (204, Value::Null, false)
    );
    assert!(t.contacts("hubspot").is_empty());
    // An address HubSpot does not know: 204 all the same (it is blocklisted).
    assert_eq!(
        call(&t, "POST", path, Some(delete)).await,
        (204, Value::Null, false)
    );
}

#[tokio::test]
async fn klaviyo_deletion_job_removes_by_email_or_phone_and_answers_202_without_a_body() {
    let t = start().await;
    for attributes in [
        json!({"email": "ann@x.io"}),
        json!({"email": "bob@x.io", "phone_number": "+15005550006"}),
    ] {
        let profile = json!({"data": {"type": "profile", "attributes": attributes}});
        assert_eq!(
            call(&t, "POST", "api/profile-import", Some(profile))
                .await
                .0,
            201
        );
    }
    let job = |attributes: Value| {
        json!({"data": {"type": "data-privacy-deletion-job", "attributes": {"profile": {
            "data": {"type": "profile", "attributes": attributes}}}}})
    };
    let path = "api/data-privacy-deletion-jobs";
    let by_email = job(json!({"email": "Ann@x.io"}));
    assert_eq!(
        call(&t, "POST", path, Some(by_email)).await,
        (202, Value::Null, false)
    );
    assert_eq!(
        t.contacts("klaviyo").keys().collect::<Vec<_>>(),
        ["bob@x.io"]
    );
    let by_phone = job(json!({"phone_number": "+15005550006"}));
    assert_eq!(
        call(&t, "POST", path, Some(by_phone)).await,
        (202, Value::Null, false)
    );
    assert!(t.contacts("klaviyo").is_empty());
    // Nobody by that address: 202 as well (Klaviyo does not say).
    let unknown = job(json!({"email": "nobody@x.io"}));
    assert_eq!(call(&t, "POST", path, Some(unknown)).await.0, 202);
}

#[tokio::test]
async fn klaviyo_deletion_jobs_have_their_own_limit_of_3_a_second() {
    let t = start().await;
    let job = json!({"data": {"type": "data-privacy-deletion-job", "attributes": {"profile": {
        "data": {"type": "profile", "attributes": {"email": "ann@x.io"}}}}}});
    let mut statuses = Vec::new();
    for _ in 0..7 {
        let r = reqwest::Client::new()
            .post(format!("{}api/data-privacy-deletion-jobs", t.url()))
            .json(&job)
            .send()
            .await
            .unwrap();
        if r.status() == 429 {
            let wait: u64 = r.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((1..=60).contains(&wait), "{wait}");
        }
        statuses.push(r.status().as_u16());
    }
    // Seven calls inside two one-second windows at most: 3 a window, the rest refused.
    let ok = statuses.iter().filter(|s| **s == 202).count();
    assert!((3..=6).contains(&ok), "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    // Another Klaviyo endpoint is not under that limit.
    let profile = json!({"data": {"type": "profile", "attributes": {"email": "c@x.io"}}});
    assert_eq!(
        call(&t, "POST", "api/profile-import", Some(profile))
            .await
            .0,
        201
    );
}

#[tokio::test]
async fn brevo_delete_removes_the_contact_and_answers_404_for_an_unknown_one() {
    let t = start().await;
    let contact = json!({"email": "ann@x.io", "attributes": {}, "updateEnabled": true});
    assert_eq!(call(&t, "POST", "v3/contacts", Some(contact)).await.0, 201);
    let path = "v3/contacts/ann%40x.io?identifierType=email_id";
    assert_eq!(
        call(&t, "DELETE", path, None).await,
        (204, Value::Null, false)
    );
    assert!(t.contacts("brevo").is_empty());
    let (status, body, _) = call(&t, "DELETE", path, None).await;
    assert_eq!(status, 404);
    assert_eq!(body["code"], "document_not_found");
}

#[tokio::test]
async fn braze_users_delete_removes_by_email_and_counts_the_users_queued() {
    let t = start().await;
    let track = json!({"attributes": [{"external_id": "42", "email": "ann@x.io"},
                                      {"external_id": "43", "email": "bob@x.io"}]});
    assert_eq!(call(&t, "POST", "users/track", Some(track)).await.0, 201);
    let delete = json!({"email_addresses": ["Ann@x.io"]});
    let (status, body, _) = call(&t, "POST", "users/delete", Some(delete.clone())).await;
    assert_eq!(
        (status, body),
        (201, json!({"deleted": 1, "message": "success"}))
    );
    assert_eq!(t.contacts("braze").keys().collect::<Vec<_>>(), ["43"]);
    let (status, body, _) = call(&t, "POST", "users/delete", Some(delete)).await;
    assert_eq!(
        (status, body),
        (201, json!({"deleted": 0, "message": "success"}))
    );
    // By external id too.
    let by_id = json!({"external_ids": ["43"]});
    assert_eq!(
        call(&t, "POST", "users/delete", Some(by_id)).await.1["deleted"],
        1
    );
    assert!(t.contacts("braze").is_empty());
}

#[tokio::test]
async fn customerio_batch_delete_removes_the_person_and_an_identify_brings_them_back() {
    let t = start().await;
    let identify = json!({"batch": [{"type": "person", "action": "identify",
        "identifiers": {"id": "42"}, "attributes": {"email": "ann@x.io"}}]});
    assert_eq!(
        call(&t, "POST", "api/v2/batch", Some(identify.clone()))
            .await
            .0,
        200
    );
    assert!(t.contacts("customerio").contains_key("42"));
    let delete = json!({"batch": [{"type": "person", "action": "delete",
        "identifiers": {"email": "ann@x.io"}}]});
    let (status, body, _) = call(&t, "POST", "api/v2/batch", Some(delete)).await;
    assert_eq!((status, body), (200, json!({"errors": []})));
    assert!(t.contacts("customerio").is_empty());
    // Unknown: 200 as well; and Customer.io does not stop a later identify.
    let unknown = json!({"batch": [{"type": "person", "action": "delete",
        "identifiers": {"id": "7"}}]});
    assert_eq!(call(&t, "POST", "api/v2/batch", Some(unknown)).await.0, 200);
    assert_eq!(
        call(&t, "POST", "api/v2/batch", Some(identify)).await.0,
        200
    );
    assert!(t.contacts("customerio").contains_key("42"));
}

#[tokio::test]
async fn mailchimp_delete_permanent_removes_the_member_and_refuses_the_address_after() {
    let t = start().await;
    let subscribe = |email: &str| {
        json!({"members": [{"email_address": email, "status": "subscribed"}],
               "update_existing": true})
    };
    assert_eq!(
        call(&t, "POST", "3.0/lists/L1", Some(subscribe("Ann@X.io")))
            .await
            .0,
        200
    );
    assert!(t.contacts("mailchimp").contains_key("ann@x.io"));
    let hash = md5_hex("ann@x.io");
    let path = format!("3.0/lists/L1/members/{hash}/actions/delete-permanent");
    assert_eq!(
        call(&t, "POST", &path, None).await,
        (204, Value::Null, false)
    );
    assert!(t.contacts("mailchimp").is_empty());
    let (status, body, _) = call(&t, "POST", &path, None).await;
    assert_eq!(status, 404);
    assert_eq!(body["title"], "Resource Not Found");

    // Added again one at a time: 400 Forgotten Email Not Subscribed.
    let member = json!({"email_address": "ann@x.io", "status": "subscribed"});
    let one = format!("3.0/lists/L1/members/{hash}");
    let (status, body, _) = call(&t, "PUT", &one, Some(member)).await;
    assert_eq!(status, 400);
    assert_eq!(body["title"], "Forgotten Email Not Subscribed");
    assert!(body["detail"].as_str().unwrap().contains("ann@x.io"));
    // In a batch: an error of its own, nobody created.
    let (status, body, _) = call(&t, "POST", "3.0/lists/L1", Some(subscribe("ann@x.io"))).await;
    assert_eq!(status, 200);
    assert_eq!(
        (body["total_created"].clone(), body["error_count"].clone()),
        (json!(0), json!(1))
    );
    assert_eq!(body["errors"][0]["email_address"], "ann@x.io");
    assert!(t.contacts("mailchimp").is_empty());
    // Someone else is still added one at a time.
    let bob = json!({"email_address": "bob@x.io", "status": "subscribed"});
    let path = format!("3.0/lists/L1/members/{}", md5_hex("bob@x.io"));
    let (status, body, _) = call(&t, "PUT", &path, Some(bob)).await;
    assert_eq!(
        (status, body["email_address"].clone()),
        (200, json!("bob@x.io"))
    );
}

#[tokio::test]
async fn salesforce_query_finds_the_contact_by_email_and_delete_removes_it_by_id() {
    let t = start().await;
    let upsert = json!({"allOrNone": false, "records": [{"attributes": {"type": "Contact"},
        "External_Id__c": "e1", "Email": "ann@x.io", "LastName": "A"}]});
    let (status, body, _) = call(
        &t,
        "PATCH",
        "services/data/v62.0/composite/sobjects/Contact/External_Id__c",
        Some(upsert),
    )
    .await;
    assert_eq!(status, 200);
    let id = body[0]["id"].as_str().unwrap().to_owned();
    let query =
        "services/data/v62.0/query?q=SELECT+Id+FROM+Contact+WHERE+Email+%3D+%27Ann%40x.io%27";
    let (status, body, _) = call(&t, "GET", query, None).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"totalSize": 1, "done": true, "records": [{"attributes": {"type": "Contact",
            "url": format!("/services/data/v62.0/sobjects/Contact/{id}")}, "Id": id}]})
    );
    let delete = format!("services/data/v62.0/sobjects/Contact/{id}");
    assert_eq!(
        call(&t, "DELETE", &delete, None).await,
        (204, Value::Null, false)
    );
    assert!(t.contacts("salesforce").is_empty());
    let (status, body, _) = call(&t, "GET", query, None).await;
    assert_eq!(
        (status, body),
        (200, json!({"totalSize": 0, "done": true, "records": []}))
    );
    let (status, body, _) = call(&t, "DELETE", &delete, None).await;
    assert_eq!(status, 404);
    assert_eq!(body[0]["errorCode"], "NOT_FOUND");
}

#[tokio::test]
async fn keap_lists_the_contact_by_email_and_delete_removes_it_by_id() {
    let t = start().await;
    let contact = |email: &str| {
        json!({"email_addresses": [{"email": email, "field": "EMAIL1"}], "given_name": "Ann",
               "duplicate_option": "Email"})
    };
    let (status, body, _) =
        call(&t, "PUT", "crm/rest/v1/contacts", Some(contact("ann@x.io"))).await;
    assert_eq!(status, 201);
    let id = body["id"].clone();
    let list = "crm/rest/v1/contacts?email=ann%40x.io";
    let (status, body, _) = call(&t, "GET", list, None).await;
    assert_eq!((status, body["count"].clone()), (200, json!(1)));
    assert_eq!(body["contacts"][0]["id"], id);
    let delete = format!("crm/rest/v1/contacts/{id}");
    assert_eq!(
        call(&t, "DELETE", &delete, None).await,
        (204, Value::Null, false)
    );
    assert!(t.contacts("keap").is_empty());
    let (_, body, _) = call(&t, "GET", list, None).await;
    assert_eq!(
        (body["count"].clone(), body["contacts"].clone()),
        (json!(0), json!([]))
    );
    assert_eq!(call(&t, "DELETE", &delete, None).await.0, 404);
    // The next contact gets an id of its own, not the erased one's.
    let (_, body, _) = call(&t, "PUT", "crm/rest/v1/contacts", Some(contact("bob@x.io"))).await;
    assert_ne!(body["id"], id);
}

#[tokio::test]
async fn usercom_delete_by_custom_id_removes_the_user_and_answers_404_after() {
    let t = start().await;
    let base = t.workspace_url("shop");
    let (status, _, _) = call(
        &t,
        "POST",
        &format!("{base}users/update_or_create/"),
        Some(json!({"custom_id": "u1", "email": "ann@x.io"})),
    )
    .await;
    assert_eq!(status, 200);
    let delete = format!("{base}users-by-id/u1/");
    assert_eq!(
        call(&t, "DELETE", &delete, None).await,
        (204, Value::Null, false)
    );
    let data = t.workspace_data("shop").unwrap();
    assert!(data.store("users").is_empty());
    let (status, body, _) = call(&t, "DELETE", &delete, None).await;
    assert_eq!((status, body), (404, json!({"detail": "Not found."})));
}
