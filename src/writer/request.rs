//! The shape of an `http_json` rule's requests (its `request`): the method, the content
//! type, a template for each record (`item`) and one for a bulk call's body (`body`), in
//! the template language of [`super::template`] (`{"attributes": {"type": "Contact"},
//! "...": "{{payload}}"}`); a body as JSON, as CSV or as a CSV file in a multipart form;
//! and a call cut by bytes. An unknown placeholder is refused when the rule is saved; a
//! record whose payload lacks a field its template names is rejected with the field's
//! name, and the others of its call go on.
//!
//! A rule may name payload fields each record must have (`require`: a field, or a list of
//! which one must be there), so a record without is rejected naming it before anything is
//! sent; and may group records into calls by a value (`group`, [`super::group`]): each
//! group one call of its own shape, every other record one call of the rule's.
//!
//! A rule states how its target deletes one record (`delete`, [`super::delete`]): a
//! delivery whose `op` is `delete` goes as that call, alone, never beside upserts.

use crate::invalid::Invalid;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::delete::DeleteShape;
use super::group::GroupShape;
use super::template::{Place, Record, Scope, Template, path_slots};

/// How a rule's requests are shaped.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RequestShape {
    /// `POST` (the default), `PUT` or `PATCH`.
    #[serde(default)]
    pub method: Option<String>,
    /// The body's content type (default `application/json`).
    #[serde(default)]
    pub content_type: Option<String>,
    /// Each record as sent (default: its payload).
    #[serde(default)]
    pub item: Option<Template>,
    /// A bulk call's body, holding `"{{records}}"` once (default: the bare array).
    #[serde(default)]
    pub body: Option<Template>,
    /// A bulk call's body as CSV instead of JSON: a header line of these columns, then a
    /// line per record with its item's field of each name (text as it is, a number or a
    /// boolean as written in JSON, null or absent empty); content type `text/csv`.
    #[serde(default)]
    pub csv: Option<Vec<String>>,
    /// The most bytes one call's body carries (Klaviyo's bulk import takes 5 MB): a bulk
    /// call is cut to stay under it, and a record too large for a call alone is rejected.
    #[serde(default)]
    pub max_bytes: Option<usize>,
    /// The CSV body sent as a file in a multipart form instead (HubSpot's imports), beside
    /// fixed fields.
    #[serde(default)]
    pub multipart: Option<Multipart>,
    /// Payload fields each record must have: a field's name, or a list of names one of
    /// which must be there (`["user_custom_id", "user_id"]`). Absent, null or a blank
    /// text is missing.
    #[serde(default)]
    pub require: Vec<Required>,
    /// Records grouped into calls by a value, each group's call shaped by it; the others
    /// go one by one as this shape sends one record.
    #[serde(default)]
    pub group: Option<GroupShape>,
    /// How the target deletes one record (a delivery whose `op` is `delete`); without it,
    /// such a delivery is rejected, never sent.
    #[serde(default)]
    pub delete: Option<DeleteShape>,
}

/// A payload field a record must have, or a list of fields one of which it must have.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Required {
    /// This field.
    Field(String),
    /// One of these fields.
    AnyOf(Vec<String>),
}

impl Required {
    /// The names it takes.
    fn names(&self) -> &[String] {
        match self {
            Required::Field(f) => std::slice::from_ref(f),
            Required::AnyOf(fs) => fs,
        }
    }

    /// Whether `payload` has it; the error names the field (and its alternatives).
    fn holds(&self, payload: &Value) -> Result<(), String> {
        let present = |name: &String| match payload.get(name) {
            None | Some(Value::Null) => false,
            Some(Value::String(s)) => !s.trim().is_empty(),
            Some(_) => true,
        };
        let names = self.names();
        if names.iter().any(present) {
            return Ok(());
        }
        let others: Vec<String> = names[1..].iter().map(|n| format!(" (or {n:?})")).collect();
        Err(format!(
            "missing required field {:?}{}",
            names[0],
            others.concat()
        ))
    }
}

/// A multipart form around a CSV body (`multipart/form-data`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Multipart {
    /// The file part's name (`files`).
    pub file: String,
    /// The file's name (`contacts.csv`).
    pub file_name: String,
    /// Fixed fields sent before the file, each by name: a string as it is, any other
    /// value as its JSON text (`importRequest`).
    #[serde(default)]
    pub fields: serde_json::Map<String, Value>,
}

/// The boundary between a multipart form's parts. A record whose item holds it is refused
/// (it would end the file early).
pub const BOUNDARY: &str = "courier-form-boundary-5f0c3e9a71d84b26";

impl RequestShape {
    /// Reads a rule's `request` (JSON), checking every placeholder against where it
    /// stands; `bulk` when the rule sends several records per call, whose `path` then
    /// names none. The error names what is wrong.
    pub fn parse(value: Option<&Value>, path: &str, bulk: bool) -> Result<Self, Invalid> {
        Self::parse_or_why(value, path, bulk).map_err(Invalid::at("request"))
    }

    fn parse_or_why(value: Option<&Value>, path: &str, bulk: bool) -> Result<Self, String> {
        let shape: RequestShape = match value {
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| format!("request: {e}"))?,
            None => RequestShape::default(),
        };
        super::wire::check_method("request: ", shape.method.as_deref())?;
        if let Some(t) = &shape.content_type
            && reqwest::header::HeaderValue::try_from(t.as_str()).is_err()
        {
            return Err(format!("request: content_type {t:?} is not a header value"));
        }
        shape.check_require_and_group()?;
        if let Some(delete) = &shape.delete {
            delete.check()?;
        }
        // With a group, the rule's own shape sends one record per call.
        let bulk = bulk && shape.group.is_none();
        if let Some(item) = &shape.item {
            item.check("item", Place::Item)?;
        }
        if let Some(body) = &shape.body {
            if !bulk {
                return Err("request: body is for rules with records_per_call above 1; one record's call sends its item".into());
            }
            let n = body.check("body", Place::Body)?;
            if n != 1 {
                return Err(format!(
                    "request: body must hold \"{{{{records}}}}\" exactly once, not {n} times"
                ));
            }
        }
        if let Some(columns) = &shape.csv {
            check_columns(columns, bulk, shape.body.is_some())?;
        }
        if let Some(m) = &shape.multipart {
            if shape.csv.is_none() {
                return Err("request: multipart sends the CSV body as a file: name csv too".into());
            }
            let names = [&m.file, &m.file_name].into_iter().chain(m.fields.keys());
            for name in names {
                if name.is_empty()
                    || name.contains(['"', '\\'])
                    || name.chars().any(char::is_control)
                {
                    return Err(format!(
                        "request: multipart name {name:?} is empty or holds a quote, a backslash \
                         or a control character"
                    ));
                }
            }
        }
        if let Some(max) = shape.max_bytes {
            let envelope = shape.encode(Vec::new()).len();
            if max <= envelope {
                return Err(format!(
                    "request: max_bytes {max} leaves no room for a record (the body without \
                     records takes {envelope})"
                ));
            }
        }
        let in_path = path_slots(path)?;
        if bulk && !in_path.is_empty() {
            return Err(format!(
                "path {path:?} names a record's field, so each call carries one record: \
                 records_per_call must be 1"
            ));
        }
        Ok(shape)
    }

    /// Checks `require` (no empty name or list) and `group` (its templates and path, and
    /// no CSV, multipart or byte cut beside it).
    fn check_require_and_group(&self) -> Result<(), String> {
        for r in &self.require {
            if r.names().is_empty() || r.names().iter().any(|n| n.trim().is_empty()) {
                return Err("request: require names an empty field, or an empty list".into());
            }
        }
        if let Some(group) = &self.group {
            group.check()?;
            if self.csv.is_some() || self.multipart.is_some() || self.max_bytes.is_some() {
                return Err(
                    "request: group sends JSON bodies of its own: give no csv, multipart or \
                     max_bytes beside it"
                        .into(),
                );
            }
        }
        Ok(())
    }

    /// The method.
    pub fn method(&self) -> reqwest::Method {
        super::wire::method(self.method.as_deref())
    }

    /// The key record `r` is grouped by, when the rule groups and `r` can join a group
    /// (it has the fields the rule requires, its key and its item can be made).
    pub fn group_key(&self, r: Record<'_>) -> Option<Value> {
        let group = self.group.as_ref()?;
        let required = self.require.iter().all(|q| q.holds(r.payload).is_ok());
        required.then(|| group.key(r)).flatten()
    }

    /// The content type.
    pub fn content_type(&self) -> String {
        match (&self.content_type, &self.csv, &self.multipart) {
            (_, _, Some(_)) => format!("multipart/form-data; boundary={BOUNDARY}"),
            (Some(t), _, _) => t.clone(),
            (None, Some(_), _) => "text/csv".into(),
            (None, None, _) => "application/json".into(),
        }
    }

    /// Whether `item` can be sent as this shape sends it: for a CSV body, every column's
    /// field a text, a number, a boolean, null or absent. The error names the column.
    pub(crate) fn sendable(&self, item: &Value) -> Result<(), String> {
        if let Some(max) = self.max_bytes {
            let alone = self.encode(Vec::new()).len() + self.item_bytes(item);
            if alone > max {
                return Err(format!(
                    "the record takes {alone} bytes as sent, over the rule's max_bytes {max} \
                     for a whole call"
                ));
            }
        }
        if self.multipart.is_some() && item.to_string().contains(BOUNDARY) {
            return Err("the record holds the multipart form's boundary".into());
        }
        let Some(columns) = &self.csv else {
            return Ok(());
        };
        let fields = item
            .as_object()
            .ok_or("a CSV row is made from an object; the item is not one")?;
        for c in columns {
            if matches!(fields.get(c), Some(Value::Array(_) | Value::Object(_))) {
                return Err(format!(
                    "column {c:?} holds a list or an object; a CSV cell holds text"
                ));
            }
        }
        Ok(())
    }

    /// A bulk call's body, as sent, around its `items` (each [`RequestShape::sendable`]).
    pub fn encode(&self, items: Vec<Value>) -> Vec<u8> {
        let Some(columns) = &self.csv else {
            return serde_json::to_vec(&self.body(items)).expect("JSON serializes");
        };
        let mut out = csv::Writer::from_writer(Vec::new());
        let row = |item: &Value| {
            columns
                .iter()
                .map(|c| cell(item.get(c)))
                .collect::<Vec<_>>()
        };
        let written = out
            .write_record(columns)
            .and_then(|()| items.iter().try_for_each(|i| out.write_record(row(i))));
        written.expect("CSV writes to memory");
        let csv = out.into_inner().expect("CSV writes to memory");
        match &self.multipart {
            Some(m) => m.form(&csv),
            None => csv,
        }
    }

    /// The bytes `item` adds to a call's body: its JSON and a comma, or its CSV line.
    pub fn item_bytes(&self, item: &Value) -> usize {
        match &self.csv {
            None => serde_json::to_vec(item).map_or(0, |v| v.len() + 1),
            Some(columns) => {
                let mut out = csv::Writer::from_writer(Vec::new());
                let written = out.write_record(columns.iter().map(|c| cell(item.get(c))));
                written.expect("CSV writes to memory");
                out.into_inner().map_or(0, |v| v.len())
            }
        }
    }

    /// `group` (indexes of records, `record` of each) cut into calls whose bodies stay
    /// within `max_bytes`, in order; a record too large alone is a call of its own (where
    /// it is refused). Without `max_bytes`, the group as it is.
    pub fn cut<'a>(
        &self,
        group: Vec<usize>,
        record: impl Fn(usize) -> Record<'a>,
    ) -> Vec<Vec<usize>> {
        let Some(max) = self.max_bytes else {
            return vec![group];
        };
        let envelope = self.encode(Vec::new()).len();
        let mut calls: Vec<Vec<usize>> = Vec::new();
        let mut size = envelope;
        for g in group {
            // A record whose item cannot be made takes no room: it is refused before sending.
            let bytes = self
                .item(record(g))
                .map_or(0, |item| self.item_bytes(&item));
            match calls.last_mut() {
                Some(call) if size + bytes <= max => call.push(g),
                _ => {
                    calls.push(vec![g]);
                    size = envelope;
                }
            }
            size += bytes;
        }
        calls
    }

    /// One record as sent: its item, or its payload; a record lacking a field the rule
    /// requires is refused naming it.
    pub(crate) fn item(&self, r: Record<'_>) -> Result<Value, String> {
        for q in &self.require {
            q.holds(r.payload)?;
        }
        match &self.item {
            Some(t) => t.fill(Scope::Record(r)),
            None => Ok(r.payload.clone()),
        }
    }

    /// A bulk call's body around its `items`: the body template, else the bare array.
    pub fn body(&self, items: Vec<Value>) -> Value {
        match &self.body {
            Some(t) => t.fill_records(&Value::Array(items)),
            None => Value::Array(items),
        }
    }
}

impl Multipart {
    /// The form: each field, then the file holding `csv`.
    fn form(&self, csv: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(csv.len() + 512);
        for (name, value) in &self.fields {
            let text = match value {
                Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            out.extend_from_slice(
                format!(
                    "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{text}\r\n"
                )
                .as_bytes(),
            );
        }
        out.extend_from_slice(
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{}\"; filename=\"{}\"\r\n\
                 Content-Type: text/csv\r\n\r\n",
                self.file, self.file_name
            )
            .as_bytes(),
        );
        out.extend_from_slice(csv);
        out.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
        out
    }
}

/// A field as a CSV cell: text as it is, a number or a boolean as in JSON, null or absent
/// empty.
fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// A CSV body's columns: for bulk rules, without a JSON body, each named once.
fn check_columns(columns: &[String], bulk: bool, body: bool) -> Result<(), String> {
    if !bulk {
        return Err("request: csv is for rules with records_per_call above 1".into());
    }
    if body {
        return Err("request: give csv or body, not both (a CSV body has no envelope)".into());
    }
    if columns.is_empty() {
        return Err("request: csv must name at least one column".into());
    }
    for (i, c) in columns.iter().enumerate() {
        if c.is_empty() || c.chars().any(char::is_control) {
            return Err(format!(
                "request: csv column {i} is empty or holds a control character"
            ));
        }
        if columns[..i].contains(c) {
            return Err(format!("request: csv names column {c:?} twice"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::template::fill_path;
    use super::*;

    fn record(payload: &Value) -> Record<'_> {
        Record {
            delivery_id: 42,
            record_key: "customer:7",
            payload,
        }
    }

    #[test]
    fn a_call_is_cut_by_bytes_and_a_record_too_large_alone_is_refused() {
        let shape = |max: usize| {
            RequestShape::parse(
                Some(&json!({"item": {"attributes": "{{payload}}"},
                             "body": {"data": "{{records}}"}, "max_bytes": max})),
                "jobs",
                true,
            )
        };
        let payloads: Vec<Value> = [10, 10, 10, 200, 10]
            .iter()
            .map(|&n| json!({"s": "x".repeat(n)}))
            .collect();
        let record = |g: usize| record(&payloads[g]);
        // {"data":[]} is 11 bytes; each small item 33 bytes and a comma.
        let small = shape(100).unwrap();
        assert_eq!(small.item_bytes(&small.item(record(0)).unwrap()), 34);
        let calls = small.cut((0..5).collect(), record);
        assert_eq!(calls, [vec![0, 1], vec![2], vec![3], vec![4]]);
        for call in &calls {
            let items: Vec<Value> = call
                .iter()
                .map(|&g| small.item(record(g)).unwrap())
                .collect();
            let sendable = items.iter().all(|i| small.sendable(i).is_ok());
            let len = small.encode(items).len();
            assert!(len <= 100 || !sendable, "{call:?}: {len} bytes");
        }
        let e = small.sendable(&small.item(record(3)).unwrap()).unwrap_err();
        assert!(e.contains("over the rule's max_bytes 100"), "{e}");
        // Wide enough: one call, as without max_bytes.
        assert_eq!(
            shape(10_000).unwrap().cut((0..5).collect(), record),
            [vec![0, 1, 2, 3, 4]]
        );
        let e = shape(11).unwrap_err();
        assert!(e.reason.contains("leaves no room for a record"), "{e}");
        let csv = RequestShape::parse(
            Some(&json!({"method": "PUT", "csv": ["s"], "max_bytes": 40})),
            "jobs/id/batches",
            true,
        )
        .unwrap();
        // "s\n" then a line of 11 bytes for each small record.
        assert_eq!(csv.cut((0..3).collect(), record), [vec![0, 1, 2]]);
        assert_eq!(
            csv.cut((0..5).collect(), record),
            [vec![0, 1, 2], vec![3], vec![4]]
        );
    }

    #[test]
    fn a_hubspot_import_sends_its_csv_as_a_file_beside_the_import_request() {
        let shape = RequestShape::parse(
            Some(&json!({"csv": ["email", "lastname"],
                         "multipart": {"file": "files", "file_name": "contacts.csv",
                                       "fields": {"importRequest": {"name": "courier"}}}})),
            "crm/v3/imports",
            true,
        )
        .unwrap();
        assert_eq!(
            shape.content_type(),
            format!("multipart/form-data; boundary={BOUNDARY}")
        );
        let body = shape.encode(vec![json!({"email": "a@x.io", "lastname": "Lovelace, A"})]);
        let want = format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"importRequest\"\r\n\r\n\
             {{\"name\":\"courier\"}}\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; \
             name=\"files\"; filename=\"contacts.csv\"\r\nContent-Type: text/csv\r\n\r\n\
             email,lastname\na@x.io,\"Lovelace, A\"\n\r\n--{BOUNDARY}--\r\n"
        );
        assert_eq!(String::from_utf8(body).unwrap(), want);
        let e = shape
            .sendable(&json!({"email": format!("--{BOUNDARY}"), "lastname": "x"}))
            .unwrap_err();
        assert!(e.contains("boundary"), "{e}");
        for (request, words) in [
            (
                json!({"multipart": {"file": "f", "file_name": "a.csv"}}),
                "name csv too",
            ),
            (
                json!({"csv": ["a"], "multipart": {"file": "f\"", "file_name": "a.csv"}}),
                "quote",
            ),
        ] {
            let e = RequestShape::parse(Some(&request), "x", true).unwrap_err();
            assert!(e.reason.contains(words), "{request}: {e}");
        }
    }

    #[test]
    fn a_hubspot_upsert_is_an_item_template_inside_an_envelope() {
        let shape = RequestShape::parse(
            Some(&json!({
                "item": {"idProperty": "email", "id": "{{payload/email}}",
                         "properties": "{{payload}}", "objectWriteTraceId": "{{delivery_id}}"},
                "body": {"inputs": "{{records}}"}
            })),
            "objects/contacts/batch/upsert",
            true,
        )
        .unwrap();
        let p = json!({"email": "ann@example.com", "firstname": "Ann"});
        let item = shape.item(record(&p)).unwrap();
        assert_eq!(
            item,
            json!({"idProperty": "email", "id": "ann@example.com",
                   "properties": {"email": "ann@example.com", "firstname": "Ann"},
                   "objectWriteTraceId": "42"})
        );
        assert_eq!(shape.body(vec![item.clone()]), json!({"inputs": [item]}));
        // Spaces inside the braces name the same placeholder.
        let spaced =
            RequestShape::parse(Some(&json!({"body": {"in": "{{ records }}"}})), "p", true)
                .unwrap();
        assert_eq!(spaced.body(vec![json!(1)]), json!({"in": [1]}));
    }

    #[test]
    fn a_klaviyo_body_nests_the_records_with_constant_siblings() {
        let shape = RequestShape::parse(
            Some(&json!({
                "content_type": "application/vnd.api+json",
                "item": {"type": "profile", "attributes": {"email": "{{payload/email}}"}},
                "body": {"data": {"type": "profile-subscription-bulk-create-job",
                                  "attributes": {"profiles": {"data": "{{records}}"}}}}
            })),
            "profile-subscription-bulk-create-jobs/",
            true,
        )
        .unwrap();
        let p = json!({"email": "b@x.io"});
        let body = shape.body(vec![shape.item(record(&p)).unwrap()]);
        assert_eq!(
            body.pointer("/data/attributes/profiles/data/0/attributes/email"),
            Some(&json!("b@x.io"))
        );
        assert_eq!(
            body.pointer("/data/type"),
            Some(&json!("profile-subscription-bulk-create-job"))
        );
        assert_eq!(shape.content_type(), "application/vnd.api+json");
    }

    #[test]
    fn a_salesforce_record_spreads_the_payload_beside_its_attributes() {
        let shape = RequestShape::parse(
            Some(&json!({"item": {"attributes": {"type": "Contact"}, "...": "{{payload}}"}})),
            "p",
            true,
        )
        .unwrap();
        let p = json!({"Email": "a@x.io", "LastName": "Ann"});
        assert_eq!(
            shape.item(record(&p)).unwrap(),
            json!({"attributes": {"type": "Contact"}, "Email": "a@x.io", "LastName": "Ann"})
        );
        let list = json!(["not", "an", "object"]);
        assert!(
            shape
                .item(record(&list))
                .unwrap_err()
                .contains("spreads an object")
        );
    }

    #[test]
    fn a_path_is_filled_url_encoded_from_the_record() {
        let p = json!({"email": "a b/c@x.io", "n": 3});
        assert_eq!(
            fill_path("lists/abc/members/{payload/email}/{payload/n}", record(&p)).unwrap(),
            "lists/abc/members/a%20b%2Fc%40x.io/3"
        );
        assert_eq!(
            fill_path("users/{delivery_id}", record(&p)).unwrap(),
            "users/42"
        );
        let e = fill_path("members/{payload/phone}", record(&p)).unwrap_err();
        assert!(e.contains("no field /phone"), "{e}");
        // Mailchimp names a member by the MD5 of the lower-cased e-mail.
        let m = json!({"email": "ABC"});
        assert_eq!(
            fill_path("lists/l1/members/{payload/email | lower | md5}", record(&m)).unwrap(),
            "lists/l1/members/900150983cd24fb0d6963f7d28e17f72"
        );
        // A dot segment would move the path: refused for that record, naming the field.
        for id in [".", "..", "%2e%2E", ".%2e"] {
            let p = json!({"id": id});
            let e = fill_path("items/{payload/id}/update", record(&p)).unwrap_err();
            assert!(e.contains("{payload/id} is a dot segment"), "{id}: {e}");
        }
        let dots = Record {
            record_key: "..",
            ..record(&p)
        };
        assert!(fill_path("items/{record_key}", dots).is_err());
        assert_eq!(
            fill_path("items/{payload/id}", record(&json!({"id": "..."}))).unwrap(),
            "items/..."
        );
        // Embedded placeholders become text.
        let shape = RequestShape::parse(
            Some(&json!({"item": {"ref": "order-{{record_key}}"}})),
            "p",
            false,
        )
        .unwrap();
        assert_eq!(
            shape.item(record(&p)).unwrap(),
            json!({"ref": "order-customer:7"})
        );
    }

    #[test]
    fn a_csv_body_has_a_header_and_a_row_per_record_quoted_where_needed() {
        let shape = RequestShape::parse(
            Some(&json!({"method": "PUT", "csv": ["External_Id__c", "LastName", "Age", "Opt"]})),
            "jobs/ingest/id/batches",
            true,
        )
        .unwrap();
        assert_eq!(shape.content_type(), "text/csv");
        let items = vec![
            json!({"External_Id__c": "c-1", "LastName": "O'Brien, \"Pat\"", "Age": 41, "Opt": true}),
            json!({"External_Id__c": "c-2", "LastName": "line\nbreak", "Age": null}),
        ];
        for i in &items {
            shape.sendable(i).unwrap();
        }
        let csv = String::from_utf8(shape.encode(items)).unwrap();
        assert_eq!(
            csv,
            "External_Id__c,LastName,Age,Opt\nc-1,\"O'Brien, \"\"Pat\"\"\",41,true\nc-2,\"line\nbreak\",,\n"
        );
        let e = shape.sendable(&json!({"LastName": {"a": 1}})).unwrap_err();
        assert!(
            e.contains("column \"LastName\" holds a list or an object"),
            "{e}"
        );
        assert!(shape.sendable(&json!(["x"])).is_err());
        for (request, words) in [
            (json!({"csv": []}), "at least one column"),
            (json!({"csv": ["a", "a"]}), "twice"),
            (
                json!({"csv": ["a"], "body": {"r": "{{records}}"}}),
                "not both",
            ),
        ] {
            let e = RequestShape::parse(Some(&request), "p", true).unwrap_err();
            assert!(e.reason.contains(words), "{request}: {e}");
        }
        let e = RequestShape::parse(Some(&json!({"csv": ["a"]})), "p", false).unwrap_err();
        assert!(e.reason.contains("records_per_call above 1"), "{e}");
    }

    #[test]
    fn required_fields_are_named_and_an_optional_one_left_out_when_absent() {
        let shape = RequestShape::parse(
            Some(&json!({"require": ["name", ["user_custom_id", "user_id"]],
                         "item": {"...": "{{payload}}",
                                  "data": {"...": "{{payload/data?}}",
                                           "id": "{{delivery_id | number}}"}}})),
            "events/",
            false,
        )
        .unwrap();
        let e = shape.item(record(&json!({"name": "n"}))).unwrap_err();
        assert_eq!(
            e,
            "missing required field \"user_custom_id\" (or \"user_id\")"
        );
        let e = shape
            .item(record(&json!({"name": " ", "user_id": 1})))
            .unwrap_err();
        assert_eq!(e, "missing required field \"name\"");
        assert_eq!(
            shape
                .item(record(&json!({"name": "n", "user_id": 1})))
                .unwrap(),
            json!({"name": "n", "user_id": 1, "data": {"id": 42}})
        );
        assert_eq!(
            shape
                .item(record(
                    &json!({"name": "n", "user_id": 1, "data": {"x": 1}})
                ))
                .unwrap()["data"],
            json!({"x": 1, "id": 42})
        );
        for (request, words) in [
            (
                json!({"item": {"a": "x{{payload/a?}}"}}),
                "only a payload field",
            ),
            (
                json!({"item": {"a": "{{delivery_id?}}"}}),
                "only a payload field",
            ),
            (json!({"require": [[]]}), "require names an empty"),
        ] {
            let e = RequestShape::parse(Some(&request), "p", false).unwrap_err();
            assert!(e.reason.contains(words), "{request}: {e}");
        }
    }

    #[test]
    fn what_cannot_be_filled_is_refused_when_the_rule_is_saved() {
        let parse =
            |v: Value, path: &str, bulk| RequestShape::parse(Some(&v), path, bulk).unwrap_err();
        let e = parse(json!({"item": {"id": "{{payload.email}}"}}), "p", true);
        assert!(
            e.reason.contains("unknown placeholder {{payload.email}}"),
            "{e}"
        );
        let e = parse(
            json!({"body": {"a": "{{records}}", "b": "{{records}}"}}),
            "p",
            true,
        );
        assert!(e.reason.contains("exactly once, not 2"), "{e}");
        let e = parse(json!({"item": {"all": "{{records}}"}}), "p", true);
        assert!(e.reason.contains("belongs in the body"), "{e}");
        let e = parse(json!({"method": "DELETE"}), "p", true);
        assert!(e.reason.contains("method \"DELETE\""), "{e}");
        let e = parse(json!({"headers": {}}), "p", true);
        assert!(e.reason.contains("unknown field `headers`"), "{e}");
        let e = RequestShape::parse(None, "members/{payload/email}", true).unwrap_err();
        assert!(e.reason.contains("records_per_call must be 1"), "{e}");
        let e = RequestShape::parse(None, "members/{email}", false).unwrap_err();
        assert!(e.reason.contains("unknown placeholder"), "{e}");
    }
}
