//! How a rule's target deletes one record (its `request.delete`): a delivery whose `op` is
//! `delete` (the record removed at the shop) is sent as this call, one record per call,
//! through the same paced call path as any other.
//!
//! ```json
//! {"delete": {"method": "DELETE", "path": "contacts/{payload/email}", "gone": [404, 410]}}
//! ```
//!
//! - `method`: `DELETE` (the default), `POST`, `PUT` or `PATCH` (a target that deletes by
//!   a call to an endpoint of its own, `contacts/remove`).
//! - `path`: a template like the rule's path, relative to the connection's base URL, filled
//!   URL-encoded from the record (its payload, delivery id and key; filters allowed).
//! - `body`: a template of the item's language (default: none, and then no body is sent).
//! - `gone`: statuses that mean the record is already gone at the target (never a 2xx,
//!   never 429): read as delivered.
//!
//! A 2xx or a `gone` status is delivered; any other answer is classified as any call's (a
//! 429 blocks the budget and costs the record nothing, a 5xx is tried again, another 4xx
//! rejects it). A delete of a rule that states no `delete` is rejected, never sent.

use serde::{Deserialize, Serialize};

use super::template::{Place, Record, Scope, Template, fill_path, path_slots};

/// The methods a delete call may use.
const METHODS: [&str; 4] = ["DELETE", "POST", "PUT", "PATCH"];

/// How a rule's target deletes one record.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteShape {
    /// `DELETE` (the default), `POST`, `PUT` or `PATCH`.
    #[serde(default)]
    pub method: Option<String>,
    /// The call's path under the base URL, filled from the record.
    pub path: String,
    /// The call's body, filled from the record; none when absent.
    #[serde(default)]
    pub body: Option<Template>,
    /// Statuses that mean the record is gone at the target already: delivered.
    #[serde(default)]
    pub gone: Vec<u16>,
}

impl DeleteShape {
    /// Checks the method, the path's placeholders, the body's and the `gone` statuses when
    /// the rule is saved; the error names the field (`request: delete: ...`).
    pub(super) fn check(&self) -> Result<(), String> {
        if let Some(m) = self.method.as_deref()
            && !METHODS.contains(&m)
        {
            return Err(format!(
                "request: delete: method {m:?} is not one of {}",
                METHODS.join(", ")
            ));
        }
        if self.path.trim().is_empty() {
            return Err("request: delete: path is empty".into());
        }
        if self.path.chars().any(char::is_control) {
            return Err(
                "request: delete: path holds a control character (percent-encode what the \
                 path needs)"
                    .into(),
            );
        }
        path_slots(&self.path).map_err(|e| format!("request: delete: {e}"))?;
        if let Some(body) = &self.body {
            body.check("delete: body", Place::Item)?;
        }
        if let Some(s) = self
            .gone
            .iter()
            .find(|&&s| !(300..=599).contains(&s) || s == 429)
        {
            return Err(format!(
                "request: delete: gone status {s} is not an error status other than 429 \
                 (a 2xx is delivered already; a 429 is the target's rate limit)"
            ));
        }
        Ok(())
    }

    /// The method.
    pub fn method(&self) -> reqwest::Method {
        match self.method.as_deref() {
            Some("POST") => reqwest::Method::POST,
            Some("PUT") => reqwest::Method::PUT,
            Some("PATCH") => reqwest::Method::PATCH,
            _ => reqwest::Method::DELETE,
        }
    }

    /// The path for record `r`, filled URL-encoded; the error names the field it lacks.
    pub fn path(&self, r: Record<'_>) -> Result<String, String> {
        fill_path(&self.path, r)
    }

    /// The body for record `r`, if the call has one.
    pub fn body(&self, r: Record<'_>) -> Result<Option<serde_json::Value>, String> {
        self.body
            .as_ref()
            .map(|t| t.fill(Scope::Record(r)))
            .transpose()
    }

    /// Whether an answer of `status` says the record is gone at the target already.
    pub fn gone(&self, status: u16) -> bool {
        self.gone.contains(&status)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn record(payload: &serde_json::Value) -> Record<'_> {
        Record {
            delivery_id: 9,
            record_key: "customer:7",
            payload,
        }
    }

    #[test]
    fn the_doc_example_parses_and_fills_one_records_call() {
        let examples = crate::doc_examples::of(include_str!("delete.rs"));
        let shape: DeleteShape = serde_json::from_value(examples[0]["delete"].clone()).unwrap();
        shape.check().unwrap();
        assert_eq!(shape.method(), reqwest::Method::DELETE);
        let p = json!({"email": "a b@x.io"});
        assert_eq!(shape.path(record(&p)).unwrap(), "contacts/a%20b%40x.io");
        assert_eq!(shape.body(record(&p)).unwrap(), None);
        assert!(shape.gone(404) && shape.gone(410) && !shape.gone(400));
        let e = shape.path(record(&json!({}))).unwrap_err();
        assert!(e.contains("no field /email"), "{e}");
    }

    #[test]
    fn a_delete_by_post_carries_its_body() {
        let shape: DeleteShape = serde_json::from_value(json!({
            "method": "POST", "path": "contacts/remove",
            "body": {"emails": ["{{payload/email}}"], "ref": "{{record_key}}"}}))
        .unwrap();
        shape.check().unwrap();
        assert_eq!(shape.method(), reqwest::Method::POST);
        let p = json!({"email": "a@x.io"});
        assert_eq!(
            shape.body(record(&p)).unwrap(),
            Some(json!({"emails": ["a@x.io"], "ref": "customer:7"}))
        );
    }

    #[test]
    fn what_cannot_be_sent_is_refused_when_the_rule_is_saved() {
        for (shape, words) in [
            (
                json!({"method": "GET", "path": "c/{payload/id}"}),
                "method \"GET\"",
            ),
            (json!({"path": " "}), "path is empty"),
            (json!({"path": "c/{email}"}), "unknown placeholder"),
            (json!({"path": "c/{records}"}), "belongs in a body"),
            (
                json!({"path": "c", "body": {"all": "{{records}}"}}),
                "belongs in the body",
            ),
            (json!({"path": "c", "gone": [204]}), "gone status 204"),
            (json!({"path": "c", "gone": [429]}), "gone status 429"),
        ] {
            let parsed: DeleteShape = serde_json::from_value(shape.clone()).unwrap();
            let e = parsed.check().unwrap_err();
            assert!(e.contains(words), "{shape}: {e}");
        }
        let unknown = serde_json::from_value::<DeleteShape>(json!({"path": "c", "query": 1}));
        assert!(unknown.unwrap_err().to_string().contains("unknown field"));
    }
}
