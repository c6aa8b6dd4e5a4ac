//! How a rule delivers through a target's asynchronous job (its `job`): the submit is the
//! rule's call as its request shapes it; its answer names the job (`id`, a JSON pointer
//! into the answer); the job is then polled (`poll`: a path with `{id}`, the status at a
//! pointer, the values that mean complete and failed) at a growing interval; once it is
//! complete, its errors are read (`errors`: a path with `{id}`, the list at a pointer, the
//! next page's link at another, each error's record by position or by a JSON pointer into
//! the submitted body). Records no error names were delivered; those named were rejected
//! with the error's message. A job that fails (or is cancelled) leaves every record of it
//! failed, to be sent again by the retry policy.
//!
//! ```json
//! {"id": "/data/id",
//!  "poll": {"path": "profile-bulk-import-jobs/{id}", "status": "/data/attributes/status",
//!           "complete": ["complete"], "failed": ["cancelled", "failed"]},
//!  "errors": {"path": "profile-bulk-import-jobs/{id}/import-errors", "items": "/data",
//!             "next": "/links/next",
//!             "record": {"pointer": {"pointer": "/attributes/source/pointer",
//!                                    "prefix": "/data/attributes/profiles/data/"}},
//!             "message": "/attributes/detail"},
//!  "first_poll_seconds": 2, "max_poll_seconds": 60, "overdue_after_seconds": 3600}
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::wire::{Body, Receipt};
use crate::invalid::{Invalid, Unread};

/// The `id` that names a job by the answer's `Location` header.
const LOCATION: &str = "Location";

/// How a rule's jobs are submitted, polled and read.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobShape {
    /// A call that opens the job before the records are sent (Salesforce Bulk API 2.0's
    /// create): its answer names the job's id, and the rule's path names it as `{id}`.
    /// Absent: the records' call is the submit, and its answer names the id.
    #[serde(default)]
    pub open: Option<Step>,
    /// A call after the records' that closes the job, so the target runs it (its path
    /// with `{id}`).
    #[serde(default)]
    pub close: Option<Step>,
    /// A call that aborts a job whose submit failed after its open (its path with `{id}`;
    /// Salesforce: `{"state": "Aborted"}`), so that no job is left open at the target when
    /// its records are sent again.
    #[serde(default)]
    pub abort: Option<Step>,
    /// Where the answer of the submit (or of `open`) names the job's id: a JSON pointer
    /// into its body, or `"Location"`: the last path segment of its `Location` header (a
    /// 202 naming its status monitor).
    pub id: String,
    /// How the job is polled.
    pub poll: Poll,
    /// How a complete job's errors are read; absent: a complete job delivered every record.
    #[serde(default)]
    pub errors: Option<Errors>,
    /// Seconds from the submit to the first poll (default 2); each poll waits twice as
    /// long as the last, up to `max_poll_seconds`.
    #[serde(default = "first_poll")]
    pub first_poll_seconds: u32,
    /// The longest wait between polls, in seconds (default 60).
    #[serde(default = "max_poll")]
    pub max_poll_seconds: u32,
    /// Seconds after its submit a job that has not finished is `overdue` (default 3600):
    /// named in status, polled no more, its records left `accepted` (the target has them;
    /// sending them again would duplicate them) unless `resend_overdue`.
    #[serde(default = "overdue_after")]
    pub overdue_after_seconds: u32,
    /// Whether an overdue job's records become `failed`, sent again by the retry policy
    /// (the target may then hold them twice).
    #[serde(default)]
    pub resend_overdue: bool,
    /// The budget its polls and error pages spend from, when the target limits those
    /// endpoints apart from the submit (Klaviyo: each job endpoint 10/s and 150/min);
    /// absent: the rule's.
    #[serde(default)]
    pub poll_budget: Option<PollBudget>,
}

/// One call of a job's submit besides the records' own: a JSON body fixed by the rule.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// `POST` (the default), `PUT` or `PATCH`.
    #[serde(default)]
    pub method: Option<String>,
    /// The path under the connection's base URL (`{id}`: the job's id, in a close).
    pub path: String,
    /// The body, sent as JSON; absent: none.
    #[serde(default)]
    pub body: Option<Value>,
}

impl Step {
    /// The method.
    pub fn method(&self) -> reqwest::Method {
        super::wire::method(self.method.as_deref())
    }

    /// The path for job `id`.
    pub fn path(&self, id: &str) -> String {
        self.path.replace("{id}", &encode(id))
    }

    fn check(&self, name: &str, names_id: bool) -> Result<(), String> {
        super::wire::check_method(&format!("job: {name}."), self.method.as_deref())?;
        match (names_id, self.path.contains("{id}")) {
            (true, false) => Err(format!("job: {name}.path must name the job's {{id}}")),
            (false, true) => Err(format!(
                "job: {name}.path cannot name {{id}}: its answer names the job"
            )),
            _ => Ok(()),
        }
    }
}

/// A budget of its own for a job's polls and error pages.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PollBudget {
    /// Its key (shared by every rule that names it).
    pub key: String,
    /// Its limits (`10/s`, `150/min`).
    pub limits: Vec<crate::ratelimit::limits::Limit>,
}

fn first_poll() -> u32 {
    2
}
fn max_poll() -> u32 {
    60
}
fn overdue_after() -> u32 {
    3600
}

/// How a job is polled.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Poll {
    /// The path, under the connection's base URL, with `{id}` for the job's id.
    pub path: String,
    /// Where the answer names the job's status (a JSON pointer).
    pub status: String,
    /// The statuses that mean the job is complete.
    pub complete: Vec<String>,
    /// The statuses that mean the job failed or was cancelled.
    pub failed: Vec<String>,
}

/// How a complete job's errors are read: at a path of the target's, or from a file whose
/// URL the complete job's poll answer names (Brevo's import reports).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Errors {
    /// The path, with `{id}`, read with the connection's credentials at its origin.
    #[serde(default)]
    pub path: Option<String>,
    /// Instead of a path: where the complete job's poll answer names the errors file's URL
    /// (a JSON pointer; null there: no record failed). The file is read with no
    /// credentials and no header of the connection, and only at one of `origins`.
    #[serde(default)]
    pub url: Option<String>,
    /// The origins an errors file may be read from (`https://files.example.com`, or
    /// `https://*.example.com` for any host under it); a URL elsewhere is not read.
    #[serde(default)]
    pub origins: Vec<String>,
    /// What the answer is: `json` (the default) or `csv`, whose rows are read as objects
    /// of the header's names (Salesforce's `failedResults`).
    #[serde(default)]
    pub format: Format,
    /// Where the answer's list of errors is (a JSON pointer; empty: the body, as for CSV).
    pub items: String,
    /// Where the answer names the next page (a URL or a path), absent or null on the last.
    #[serde(default)]
    pub next: Option<String>,
    /// The query parameter the value at `next` fills on the first page's path (a cursor,
    /// as HubSpot's `after`); absent: that value is the next page's link.
    #[serde(default)]
    pub cursor: Option<String>,
    /// How an error names its record.
    pub record: ErrorRecord,
    /// Where an error's text is (absent: the whole error is quoted).
    #[serde(default)]
    pub message: Option<String>,
}

/// Where a complete job's errors file is, as its poll answer names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorsFile {
    /// No file: the answer holds null there, no record failed.
    None,
    /// The file, at an origin the rule allows.
    At(reqwest::Url),
    /// The answer names no file at the pointer: what became of each record is unknown.
    Unnamed(String),
    /// The URL cannot be read (not one, or at an origin the rule does not allow).
    Refused(String),
}

impl Errors {
    /// Checks that exactly one of `path` and `url` is named, and `url`'s origins.
    fn check_source(&self) -> Result<(), String> {
        match (&self.path, &self.url) {
            (Some(path), None) if path.contains("{id}") => {}
            (Some(_), None) => return Err("job: errors.path must name the job's {id}".into()),
            (None, Some(url)) => {
                pointer_ok("errors.url", url)?;
                if self.next.is_some() || self.cursor.is_some() {
                    return Err(
                        "job: an errors file is one list: errors.url takes no next or cursor"
                            .into(),
                    );
                }
                if self.origins.is_empty() {
                    return Err(
                        "job: errors.url needs errors.origins, the origins its file \
                                may be read from"
                            .into(),
                    );
                }
                for o in &self.origins {
                    check_origin(o).map_err(|why| format!("job: errors.origins {o:?}: {why}"))?;
                }
            }
            _ => return Err("job: errors names either path or url".into()),
        }
        if self.path.is_some() && !self.origins.is_empty() {
            return Err("job: errors.origins goes with errors.url".into());
        }
        if let Some(c) = &self.cursor {
            if self.next.is_none() {
                return Err("job: errors.cursor is filled from errors.next: name it too".into());
            }
            if c.is_empty()
                || !c
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.[]".contains(&b))
            {
                return Err(format!(
                    "job: errors.cursor {c:?} is not a query parameter's name"
                ));
            }
        }
        Ok(())
    }

    /// The errors file a complete job's poll `answer` names.
    pub fn file(&self, answer: Option<&Value>) -> ErrorsFile {
        let Some(pointer) = &self.url else {
            return ErrorsFile::None;
        };
        let raw = match answer.and_then(|a| a.pointer(pointer)) {
            Some(Value::Null) => return ErrorsFile::None,
            Some(Value::String(s)) => s,
            Some(other) => {
                return ErrorsFile::Refused(format!(
                    "its errors file at {pointer:?} is {}, not a URL",
                    kind(other)
                ));
            }
            None => {
                return ErrorsFile::Unnamed(format!(
                    "the complete job's answer names no errors file at {pointer:?}"
                ));
            }
        };
        let Ok(url) = reqwest::Url::parse(raw) else {
            return ErrorsFile::Refused(format!("its errors file at {pointer:?} is not a URL"));
        };
        match self.origins.iter().any(|o| origin_matches(o, &url)) {
            true => ErrorsFile::At(url),
            false => ErrorsFile::Refused(format!(
                "its errors file is at {}, an origin errors.origins does not name",
                url.origin().ascii_serialization()
            )),
        }
    }
}

/// Whether `pattern` is an origin: `scheme://host[:port]`, http or https, a host of
/// `*.` and a domain allowed, nothing after.
fn check_origin(pattern: &str) -> Result<(), String> {
    let url = reqwest::Url::parse(&pattern.replacen("*.", "wildcard.", 1))
        .map_err(|e| format!("not an origin ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("not an http(s) origin with a host".into());
    }
    let bare = url.origin().ascii_serialization();
    match bare == pattern.replacen("*.", "wildcard.", 1) {
        true => Ok(()),
        false => Err("an origin is scheme, host and port only, without a path".into()),
    }
}

/// Whether `url` is at the origin `pattern` (`https://*.example.com` matches any host
/// under example.com, not example.com itself).
fn origin_matches(pattern: &str, url: &reqwest::Url) -> bool {
    let origin = url.origin().ascii_serialization();
    match pattern.split_once("://*.") {
        Some((scheme, rest)) => origin
            .strip_prefix(scheme)
            .and_then(|o| o.strip_prefix("://"))
            .is_some_and(|host| host.ends_with(&format!(".{rest}"))),
        None => origin == pattern,
    }
}

/// What a job's answer is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// JSON.
    #[default]
    Json,
    /// CSV with a header line.
    Csv,
}

/// How an error names its record.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ErrorRecord {
    /// Its position in the submitted records, from 0, at this pointer.
    Index(String),
    /// A JSON pointer into the submitted body at `pointer`, whose records are under
    /// `prefix` (`/data/attributes/profiles/data/3/attributes/email` names record 3).
    Pointer {
        /// Where the error holds the pointer.
        pointer: String,
        /// The pointer to the submitted records' array, ending in `/`.
        prefix: String,
    },
    /// A value of the record, at `error` in the error and at `record` in the record's
    /// payload (Salesforce's failed rows carry the external id column).
    Key {
        /// Where the error holds the value.
        error: String,
        /// Where the record's payload holds it.
        record: String,
        /// Whether keys match whatever their case (e-mail addresses, which a target may
        /// report lowercased).
        #[serde(default)]
        ignore_case: bool,
    },
}

/// What a poll's answer says of the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    /// Still running (the status it names).
    Running(String),
    /// Complete: its errors say which records were refused.
    Complete,
    /// Failed or cancelled (the status it names).
    Failed(String),
}

/// One error of a complete job: the record's position, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordError {
    /// The record's position in the submitted records, from 0.
    pub index: usize,
    /// What the target said.
    pub message: String,
}

fn pointer_ok(name: &str, p: &str) -> Result<(), String> {
    match p.is_empty() || p.starts_with('/') {
        true => Ok(()),
        false => Err(format!(
            "job: {name} {p:?} is not a JSON pointer (empty, or starting with /)"
        )),
    }
}

impl JobShape {
    /// Reads a rule's `job`, checking every pointer and path; the error names the field
    /// within `job`.
    pub fn parse(value: &Value) -> Result<Self, Invalid> {
        Self::read(value).map_err(Invalid::at("job"))
    }

    fn read(value: &Value) -> Result<Self, String> {
        let shape: JobShape = serde_json::from_value(value.clone())
            .map_err(|e| format!("job: {e} (see docs/catalog.md, \"Asynchronous jobs\")"))?;
        if shape.id != LOCATION {
            pointer_ok("id", &shape.id)?;
        }
        if let Some(open) = &shape.open {
            open.check("open", false)?;
        }
        if let Some(close) = &shape.close {
            if shape.open.is_none() {
                return Err("job: close follows an open call: name open too".into());
            }
            close.check("close", true)?;
        }
        if let Some(abort) = &shape.abort {
            if shape.open.is_none() {
                return Err("job: abort undoes an open call: name open too".into());
            }
            abort.check("abort", true)?;
        }
        pointer_ok("poll.status", &shape.poll.status)?;
        if !shape.poll.path.contains("{id}") {
            return Err("job: poll.path must name the job's {id}".into());
        }
        if shape.poll.complete.is_empty() {
            return Err("job: poll.complete must name at least one status".into());
        }
        if let Some(e) = &shape.errors {
            e.check_source()?;
            pointer_ok("errors.items", &e.items)?;
            if e.format == Format::Csv && (!e.items.is_empty() || e.next.is_some()) {
                return Err(
                    "job: a CSV errors answer is one list: errors.items must be \"\" and no next"
                        .into(),
                );
            }
            for (name, p) in [
                ("errors.next", e.next.as_deref()),
                ("errors.message", e.message.as_deref()),
            ] {
                if let Some(p) = p {
                    pointer_ok(name, p)?;
                }
            }
            match &e.record {
                ErrorRecord::Index(p) => pointer_ok("errors.record.index", p)?,
                ErrorRecord::Key { error, record, .. } => {
                    pointer_ok("errors.record.key.error", error)?;
                    pointer_ok("errors.record.key.record", record)?;
                }
                ErrorRecord::Pointer { pointer, prefix } => {
                    pointer_ok("errors.record.pointer", pointer)?;
                    if !prefix.starts_with('/') || !prefix.ends_with('/') {
                        return Err(
                            "job: errors.record.prefix must be a JSON pointer ending in /".into(),
                        );
                    }
                }
            }
        }
        if shape.first_poll_seconds == 0 || shape.max_poll_seconds < shape.first_poll_seconds {
            return Err(
                "job: first_poll_seconds must be at least 1 and at most max_poll_seconds".into(),
            );
        }
        if let Some(b) = &shape.poll_budget {
            if b.key.is_empty() || b.key.len() > 200 || b.key.chars().any(char::is_control) {
                return Err("job: poll_budget.key must be 1 to 200 printable characters".into());
            }
            if b.limits.is_empty() {
                return Err("job: poll_budget.limits must name at least one limit".into());
            }
            crate::ratelimit::limits::check(b.limits.clone())
                .map_err(|e| format!("job: poll_budget.limits: {e}"))?;
        }
        if shape.overdue_after_seconds < shape.first_poll_seconds {
            return Err("job: overdue_after_seconds must be at least first_poll_seconds".into());
        }
        Ok(shape)
    }

    /// The job's id in the submit's answer, or why it names none.
    pub fn target_id(&self, answer: &Receipt) -> Result<String, Unread> {
        if self.id == LOCATION {
            let segment = answer.location.as_deref().and_then(|l| {
                let path = l.split(['?', '#']).next()?;
                path.trim_end_matches('/').rsplit('/').next()
            });
            return match segment {
                Some(id) if !id.is_empty() && id.len() <= 200 => Ok(id.to_owned()),
                _ => Err("the answer names no job in its Location header".into()),
            };
        }
        let found = answer.body.json().and_then(|a| a.pointer(&self.id));
        match found {
            Some(Value::String(s)) if !s.is_empty() && s.len() <= 200 => Ok(s.clone()),
            Some(Value::Number(n)) => Ok(n.to_string()),
            Some(other) => Err(Unread(format!(
                "the answer's job id at {:?} is not a usable id ({})",
                self.id,
                kind(other)
            ))),
            None => Err(Unread(format!(
                "the answer names no job id at {:?}",
                self.id
            ))),
        }
    }

    /// `path` (the rule's, or a step's) with `{id}` the job's id.
    pub fn id_path(&self, path: &str, id: &str) -> String {
        path.replace("{id}", &encode(id))
    }

    /// The poll's path for job `id`.
    pub fn poll_path(&self, id: &str) -> String {
        self.poll.path.replace("{id}", &encode(id))
    }

    /// What a poll's answer says of the job; an answer without a status at the pointer
    /// is running (the target said nothing new), with why.
    pub fn state(&self, answer: Option<&Value>) -> JobState {
        match answer.and_then(|a| a.pointer(&self.poll.status)) {
            Some(Value::String(s)) if self.poll.complete.contains(s) => JobState::Complete,
            Some(Value::String(s)) if self.poll.failed.contains(s) => JobState::Failed(s.clone()),
            Some(Value::String(s)) => JobState::Running(s.clone()),
            _ => JobState::Running(format!("no status at {:?}", self.poll.status)),
        }
    }

    /// The first errors page's path for job `id`, when the target lists errors at a path.
    pub fn errors_path(&self, id: &str) -> Option<String> {
        let path = self.errors.as_ref()?.path.as_ref()?;
        Some(path.replace("{id}", &encode(id)))
    }

    /// The path or link of the errors page after one whose `next` said `said`: the first
    /// page's path with the cursor set to it, or the link itself.
    pub fn next_page(&self, id: &str, said: String) -> String {
        let (Some(cursor), Some(first)) = (
            self.errors.as_ref().and_then(|e| e.cursor.as_ref()),
            self.errors_path(id),
        ) else {
            return said;
        };
        let joint = if first.contains('?') { '&' } else { '?' };
        format!("{first}{joint}{cursor}={}", encode(&said))
    }

    /// An errors answer as JSON: the body's JSON, or its CSV rows as objects (each header
    /// name to the row's text).
    pub fn errors_answer(&self, body: &Body) -> Result<Value, Unread> {
        let format = self.errors.as_ref().map_or(Format::Json, |e| e.format);
        match (format, body) {
            (Format::Json, Body::Json(v)) => Ok(v.clone()),
            (Format::Json, Body::Text(t)) => serde_json::from_str(t)
                .map_err(|e| Unread(format!("an errors file is not JSON ({e})"))),
            (Format::Csv, Body::Text(t)) => csv_rows(t).map_err(Unread),
            (Format::Csv, Body::Empty) => Ok(Value::Array(Vec::new())),
            (_, Body::Unreadable(why)) => Err(Unread(why.clone())),
            (Format::Json, _) => Err("an errors page is not JSON".into()),
            (Format::Csv, _) => Err("an errors answer is not CSV (text/csv)".into()),
        }
    }

    /// The pointer into a record's payload its errors name it by, if they name it by a key.
    pub fn key_pointer(&self) -> Option<&str> {
        match &self.errors.as_ref()?.record {
            ErrorRecord::Key { record, .. } => Some(record),
            _ => None,
        }
    }

    /// A key as errors and records are matched by: as it is, or lowercased where the rule
    /// ignores case.
    pub fn key(&self, key: String) -> String {
        match self.errors.as_ref().map(|e| &e.record) {
            Some(ErrorRecord::Key {
                ignore_case: true, ..
            }) => key.to_lowercase(),
            _ => key,
        }
    }

    /// One errors page: the records it names, those it may name (by a key several records
    /// share, or past the records), those it names by a key no record has, and the next
    /// page's link.
    pub fn errors_page(&self, page: &Value, records: &Records) -> Result<ErrorsPage, Unread> {
        let mut out = ErrorsPage::default();
        let Some(e) = &self.errors else {
            return Ok(out);
        };
        let items = page
            .pointer(&e.items)
            .and_then(Value::as_array)
            .ok_or_else(|| Unread(format!("an errors page holds no list at {:?}", e.items)))?;
        for item in items {
            let index = match &e.record {
                ErrorRecord::Index(p) => {
                    item.pointer(p).and_then(Value::as_u64).map(|i| i as usize)
                }
                ErrorRecord::Key { error, .. } => {
                    let key = item.pointer(error).map(|k| self.key(text(k)));
                    let index = key.as_ref().and_then(|k| records.keys.get(k).copied());
                    if let Some(k) = key.filter(|k| index.is_none() && !records.shared.contains(k))
                        && !k.is_empty()
                    {
                        out.stray += 1;
                        continue;
                    }
                    index
                }
                ErrorRecord::Pointer { pointer, prefix } => item
                    .pointer(pointer)
                    .and_then(Value::as_str)
                    .and_then(|p| p.strip_prefix(prefix.as_str()))
                    .and_then(|rest| rest.split('/').next())
                    .and_then(|n| n.parse().ok()),
            };
            let message = match &e.message {
                Some(p) => item.pointer(p).map_or_else(
                    || item.to_string(),
                    |m| m.as_str().map_or_else(|| m.to_string(), str::to_owned),
                ),
                None => format!("the target's errors name it: {item}"),
            };
            match index {
                Some(index) if index < records.count => {
                    out.errors.push(RecordError { index, message });
                }
                _ => out.unmatched += 1,
            }
        }
        out.next = e
            .next
            .as_deref()
            .and_then(|p| page.pointer(p))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        Ok(out)
    }
}

/// What one page of a job's errors says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorsPage {
    /// The errors naming a record of the job.
    pub errors: Vec<RecordError>,
    /// Errors that may name a record of the job without saying which: by a key several of
    /// its records share (or none has), or past its records.
    pub unmatched: usize,
    /// Errors naming a record by a key none of the job's records has: some record of it
    /// failed, and courier cannot tell which.
    pub stray: usize,
    /// The next page's link.
    pub next: Option<String>,
}

/// The records of a job, as its errors name them.
#[derive(Clone, Debug, Default)]
pub struct Records {
    /// How many were submitted.
    pub count: usize,
    /// Each record's key ([`JobShape::key_pointer`]) to its position; empty when errors
    /// name records otherwise.
    pub keys: std::collections::HashMap<String, usize>,
    /// The positions of records an error cannot name by key: without one, or sharing it
    /// with another record of the job.
    pub unkeyed: Vec<usize>,
    /// The keys several records of the job share.
    pub shared: std::collections::HashSet<String>,
}

impl Records {
    /// `count` records named by position or pointer.
    pub fn counted(count: usize) -> Self {
        Self {
            count,
            keys: Default::default(),
            unkeyed: Vec::new(),
            shared: Default::default(),
        }
    }

    /// `keys.len()` records named by `keys` (each record's key, if it has one); a key
    /// two records share names neither.
    pub fn keyed(keys: Vec<Option<String>>) -> Self {
        let mut records = Self::counted(keys.len());
        let mut seen: std::collections::HashMap<String, Vec<usize>> = Default::default();
        for (i, key) in keys.into_iter().enumerate() {
            match key {
                Some(k) => seen.entry(k).or_default().push(i),
                None => records.unkeyed.push(i),
            }
        }
        for (key, at) in seen {
            match at[..] {
                [one] => {
                    records.keys.insert(key, one);
                }
                _ => {
                    records.unkeyed.extend(at);
                    records.shared.insert(key);
                }
            }
        }
        records.unkeyed.sort_unstable();
        records
    }
}

/// A value as a key or a CSV cell: text as it is, anything else as JSON.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// CSV text with a header line as a list of objects, each header name to the row's text.
fn csv_rows(text: &str) -> Result<Value, String> {
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_bytes());
    let header = reader
        .headers()
        .map_err(|e| format!("the CSV answer's header cannot be read: {e}"))?
        .clone();
    let mut rows = Vec::new();
    for row in reader.records() {
        let row = row.map_err(|e| format!("the CSV answer cannot be read: {e}"))?;
        let fields = header
            .iter()
            .zip(row.iter())
            .map(|(h, v)| (h.to_owned(), Value::String(v.to_owned())))
            .collect();
        rows.push(Value::Object(fields));
    }
    Ok(Value::Array(rows))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "an empty or overlong string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A job id as a path segment: anything but unreserved characters percent-encoded, so a
/// hostile id cannot climb out of the path.
fn encode(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_documented_example_is_a_job_shape_courier_takes() {
        let examples = crate::doc_examples::of(include_str!("job.rs"));
        assert_eq!(examples.len(), 1);
        super::JobShape::parse(&examples[0]).unwrap();
    }

    use serde_json::json;

    use super::*;

    fn klaviyo() -> JobShape {
        JobShape::parse(&json!({
            "id": "/data/id",
            "poll": {"path": "profile-bulk-import-jobs/{id}", "status": "/data/attributes/status",
                     "complete": ["complete"], "failed": ["cancelled"]},
            "errors": {"path": "profile-bulk-import-jobs/{id}/import-errors", "items": "/data",
                       "next": "/links/next",
                       "record": {"pointer": {"pointer": "/source/pointer",
                                              "prefix": "/data/attributes/profiles/data/"}},
                       "message": "/detail"}
        }))
        .unwrap()
    }

    #[test]
    fn a_job_is_named_polled_and_its_errors_read_by_pointer() {
        let shape = klaviyo();
        let answer = |body: Value| Receipt {
            body: Body::Json(body),
            ..Receipt::default()
        };
        assert_eq!(
            shape.target_id(&answer(json!({"data": {"id": "01J"}}))),
            Ok("01J".into())
        );
        let e = shape.target_id(&answer(json!({"data": {}}))).unwrap_err();
        assert!(e.0.contains("no job id at \"/data/id\""), "{e}");
        assert!(shape.target_id(&Receipt::default()).is_err());
        // A 202 naming its status monitor in Location.
        let mut located = shape.clone();
        located.id = LOCATION.into();
        let at = |l: &str| Receipt {
            location: Some(l.into()),
            ..Receipt::default()
        };
        assert_eq!(
            located.target_id(&at("https://t.example/api/jobs/j-7?x=1")),
            Ok("j-7".into())
        );
        assert_eq!(located.target_id(&at("/jobs/j-8/")), Ok("j-8".into()));
        assert!(located.target_id(&Receipt::default()).is_err());
        assert_eq!(
            shape.poll_path("a/../b"),
            "profile-bulk-import-jobs/a%2F..%2Fb"
        );
        let polled = |s: &str| shape.state(Some(&json!({"data": {"attributes": {"status": s}}})));
        assert_eq!(polled("queued"), JobState::Running("queued".into()));
        assert_eq!(polled("complete"), JobState::Complete);
        assert_eq!(polled("cancelled"), JobState::Failed("cancelled".into()));
        let page = json!({"data": [
            {"detail": "bad email", "source": {"pointer": "/data/attributes/profiles/data/3/attributes/email"}},
            {"detail": "elsewhere", "source": {"pointer": "/data/attributes/lists"}},
            {"detail": "past the end", "source": {"pointer": "/data/attributes/profiles/data/9"}}
        ], "links": {"next": "https://a.klaviyo.com/api/x?page[cursor]=2"}});
        let read = shape.errors_page(&page, &Records::counted(5)).unwrap();
        let (errors, unmatched, next) = (read.errors, read.unmatched, read.next);
        assert_eq!(
            errors,
            [RecordError {
                index: 3,
                message: "bad email".into()
            }]
        );
        assert_eq!(unmatched, 2);
        assert_eq!(
            next.as_deref(),
            Some("https://a.klaviyo.com/api/x?page[cursor]=2")
        );
        assert!(
            shape
                .errors_page(&json!({"nope": 1}), &Records::counted(5))
                .is_err()
        );
    }

    #[test]
    fn a_salesforce_job_is_opened_closed_and_its_failed_rows_named_by_key() {
        let shape = JobShape::parse(&json!({
            "open": {"path": "jobs/ingest", "body": {"object": "Contact", "contentType": "CSV"}},
            "close": {"method": "PATCH", "path": "jobs/ingest/{id}", "body": {"state": "UploadComplete"}},
            "id": "/id",
            "poll": {"path": "jobs/ingest/{id}", "status": "/state",
                     "complete": ["JobComplete"], "failed": ["Failed", "Aborted"]},
            "errors": {"path": "jobs/ingest/{id}/failedResults/", "format": "csv", "items": "",
                       "record": {"key": {"error": "/External_Id__c", "record": "/External_Id__c"}},
                       "message": "/sf__Error"}
        }))
        .unwrap();
        assert_eq!(
            shape.close.as_ref().unwrap().path("7/5"),
            "jobs/ingest/7%2F5"
        );
        assert_eq!(shape.key_pointer(), Some("/External_Id__c"));
        let csv = "\"sf__Id\",\"sf__Error\",External_Id__c,LastName\n\
                   \"\",\"REQUIRED_FIELD_MISSING:Required fields are missing: [LastName]\",c-2,\"\"\n\
                   \"\",\"INVALID, \"\"quoted\"\"\nline\",c-9,X\n";
        let body = shape.errors_answer(&Body::Text(csv.into())).unwrap();
        let records = Records::keyed(vec![
            Some("c-1".into()),
            Some("c-2".into()),
            None,
            Some("c-3".into()),
            Some("c-3".into()),
        ]);
        assert_eq!(records.unkeyed, [2, 3, 4]);
        let read = shape.errors_page(&body, &records).unwrap();
        let (errors, unmatched, next) = (read.errors, read.unmatched, read.next);
        assert_eq!(read.stray, 1, "c-9 is no record's key");
        assert_eq!(
            errors,
            [RecordError {
                index: 1,
                message: "REQUIRED_FIELD_MISSING:Required fields are missing: [LastName]".into()
            }]
        );
        assert_eq!((unmatched, next), (0, None));
        assert_eq!(
            shape.errors_answer(&Body::Empty).unwrap(),
            json!([]),
            "no failed rows: an empty answer"
        );
        let e = shape.errors_answer(&Body::Json(json!([]))).unwrap_err();
        assert!(e.0.contains("not CSV"), "{e}");
        for (job, words) in [
            (
                json!({"open": {"path": "j/{id}"}, "id": "/id", "poll": {"path": "j/{id}", "status": "/s", "complete": ["ok"], "failed": []}}),
                "open.path cannot name",
            ),
            (
                json!({"close": {"path": "j/{id}"}, "id": "/id", "poll": {"path": "j/{id}", "status": "/s", "complete": ["ok"], "failed": []}}),
                "close follows an open",
            ),
            (
                json!({"open": {"path": "j"}, "close": {"path": "j"}, "id": "/id", "poll": {"path": "j/{id}", "status": "/s", "complete": ["ok"], "failed": []}}),
                "close.path must name",
            ),
            (
                json!({"open": {"path": "j", "method": "GET"}, "id": "/id", "poll": {"path": "j/{id}", "status": "/s", "complete": ["ok"], "failed": []}}),
                "open.method",
            ),
            (
                json!({"id": "/id", "poll": {"path": "j/{id}", "status": "/s", "complete": ["ok"], "failed": []},
                    "errors": {"path": "e/{id}", "format": "csv", "items": "/data", "record": {"index": "/i"}}}),
                "CSV errors answer is one list",
            ),
        ] {
            let e = JobShape::parse(&job).unwrap_err();
            assert!(e.reason.contains(words), "{job}: {e}");
        }
    }

    #[test]
    fn an_errors_file_is_read_only_at_an_allowed_origin_and_a_stray_key_is_counted() {
        let job = |errors: Value| {
            JobShape::parse(&json!({"id": "/processId",
                "poll": {"path": "processes/{id}", "status": "/status", "complete": ["completed"],
                         "failed": ["failed"]},
                "errors": errors}))
        };
        let shape = job(json!({"url": "/info/import/invalid_emails",
            "origins": ["https://*.brevo.com", "http://localhost:8080"], "format": "csv",
            "items": "", "record": {"key": {"error": "/EMAIL", "record": "/email"}}}))
        .unwrap();
        let errors = shape.errors.as_ref().unwrap();
        let named =
            |v: Value| errors.file(Some(&json!({"info": {"import": {"invalid_emails": v}}})));
        let at = |u: &str| ErrorsFile::At(reqwest::Url::parse(u).unwrap());
        for allowed in [
            "https://files.brevo.com/r/1.csv",
            "https://a.b.brevo.com/r.csv",
            "http://localhost:8080/import-reports/1/invalid_emails.csv",
        ] {
            assert_eq!(named(json!(allowed)), at(allowed));
        }
        for refused in [
            "https://brevo.com/r.csv",
            "https://evilbrevo.com/r.csv",
            "http://files.brevo.com/r.csv",
            "http://localhost:8081/r.csv",
            "http://127.0.0.1:8080/r.csv",
            "file:///etc/passwd",
            "not a url",
        ] {
            assert!(
                matches!(named(json!(refused)), ErrorsFile::Refused(_)),
                "{refused}"
            );
        }
        assert_eq!(named(Value::Null), ErrorsFile::None);
        assert!(matches!(named(json!(7)), ErrorsFile::Refused(_)));
        assert!(matches!(
            errors.file(Some(&json!({"info": {}}))),
            ErrorsFile::Unnamed(_)
        ));
        assert_eq!(shape.errors_path("1"), None);
        let records = Records::keyed(vec![
            Some("a@x".into()),
            Some("b@x".into()),
            Some("b@x".into()),
        ]);
        let rows = shape
            .errors_answer(&Body::Text("EMAIL\na@x\nB@X\nb@x\n\n".into()))
            .unwrap();
        let read = shape.errors_page(&rows, &records).unwrap();
        assert_eq!(read.errors.len(), 1);
        assert!(read.errors[0].message.contains("a@x"), "{:?}", read.errors);
        assert_eq!(
            (read.unmatched, read.stray),
            (1, 1),
            "b@x shared; B@X no one's"
        );
        // Matched whatever their case, the way e-mail addresses are.
        let mut shape = shape;
        if let Some(ErrorRecord::Key { ignore_case, .. }) =
            shape.errors.as_mut().map(|e| &mut e.record)
        {
            *ignore_case = true;
        }
        let records = Records::keyed(
            ["A@x", "c@x"]
                .into_iter()
                .map(|k| Some(shape.key(k.into())))
                .collect(),
        );
        let rows = shape
            .errors_answer(&Body::Text("EMAIL\na@X\n".into()))
            .unwrap();
        let read = shape.errors_page(&rows, &records).unwrap();
        assert_eq!((read.errors.len(), read.stray), (1, 0), "{read:?}");
        assert_eq!(read.errors[0].index, 0);
    }

    #[test]
    fn an_errors_source_is_a_path_or_a_url_with_its_origins() {
        let job = |errors: Value| {
            JobShape::parse(&json!({"id": "/id",
                "poll": {"path": "p/{id}", "status": "/s", "complete": ["done"], "failed": []},
                "errors": errors}))
        };
        for (errors, words) in [
            (
                json!({"url": "/u", "path": "e/{id}", "origins": ["https://a.example"], "items": "", "record": {"index": "/i"}}),
                "either path or url",
            ),
            (
                json!({"items": "", "record": {"index": "/i"}}),
                "either path or url",
            ),
            (
                json!({"url": "/u", "items": "", "record": {"index": "/i"}}),
                "needs errors.origins",
            ),
            (
                json!({"url": "/u", "origins": ["https://a.example/path"], "items": "", "record": {"index": "/i"}}),
                "without a path",
            ),
            (
                json!({"url": "/u", "origins": ["ftp://a.example"], "items": "", "record": {"index": "/i"}}),
                "http(s)",
            ),
            (
                json!({"url": "/u", "origins": ["https://a.example"], "next": "/n", "items": "", "record": {"index": "/i"}}),
                "takes no next",
            ),
            (
                json!({"path": "e/{id}", "origins": ["https://a.example"], "items": "", "record": {"index": "/i"}}),
                "goes with errors.url",
            ),
            (
                json!({"path": "e/{id}", "cursor": "after", "items": "", "record": {"index": "/i"}}),
                "name it too",
            ),
            (
                json!({"path": "e/{id}", "cursor": "a b", "next": "/n", "items": "", "record": {"index": "/i"}}),
                "not a query parameter",
            ),
        ] {
            let e = job(errors.clone()).unwrap_err();
            assert!(e.reason.contains(words), "{errors}: {e}");
        }
    }

    #[test]
    fn a_cursor_fills_the_first_pages_path() {
        let shape = JobShape::parse(&json!({"id": "/id",
            "poll": {"path": "crm/v3/imports/{id}", "status": "/state", "complete": ["DONE"],
                     "failed": ["FAILED"]},
            "errors": {"path": "crm/v3/imports/{id}/errors?limit=100", "items": "/results",
                       "next": "/paging/next/after", "cursor": "after",
                       "record": {"key": {"error": "/sourceData/rowData/0", "record": "/email"}}}}))
        .unwrap();
        assert_eq!(
            shape.next_page("7", "a b&c".into()),
            "crm/v3/imports/7/errors?limit=100&after=a%20b%26c"
        );
        assert_eq!(
            klaviyo().next_page("7", "https://a.klaviyo.com/x".into()),
            "https://a.klaviyo.com/x"
        );
    }

    #[test]
    fn each_mistake_is_named() {
        for (job, words) in [
            (
                json!({"id": "data/id", "poll": {"path": "j/{id}", "status": "/s", "complete": ["ok"], "failed": []}}),
                "not a JSON pointer",
            ),
            (
                json!({"id": "/id", "poll": {"path": "j", "status": "/s", "complete": ["ok"], "failed": []}}),
                "poll.path must name",
            ),
            (
                json!({"id": "/id", "poll": {"path": "j/{id}", "status": "/s", "complete": [], "failed": []}}),
                "poll.complete",
            ),
            (
                json!({"id": "/id", "poll": {"path": "j/{id}", "status": "/s", "complete": ["ok"], "failed": []}, "first_poll_seconds": 0}),
                "first_poll_seconds",
            ),
            (json!({"id": "/id", "pol": {}}), "unknown field"),
        ] {
            let e = JobShape::parse(&job).unwrap_err();
            assert!(e.reason.contains(words), "{job}: {e}");
        }
    }
}
