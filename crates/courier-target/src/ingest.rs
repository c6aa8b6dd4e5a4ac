//! Salesforce Bulk API 2.0 ingest jobs, as its reference describes them: `POST
//! .../jobs/ingest` (`{"object", "operation", "externalIdFieldName", "contentType": "CSV"}`)
//! opens a job (`id`, `state` `Open`); `PUT .../jobs/ingest/{id}/batches` uploads its CSV
//! (`text/csv`, once, 201); `PATCH .../jobs/ingest/{id}` with `{"state": "UploadComplete"}`
//! closes it (a job never closed is never run); `GET .../jobs/ingest/{id}` says
//! `UploadComplete`, then `InProgress`, then `JobComplete` (or `Aborted`, or stays
//! `InProgress`, as [`JobsConfig::end`] says) after [`JobsConfig::complete_after`];
//! `GET .../jobs/ingest/{id}/failedResults/` is CSV: `"sf__Id","sf__Error"` and the
//! uploaded columns, one row per failed record. A row fails as Salesforce fails a Contact
//! without its required last name: when the upload has a `LastName` column and the row's
//! is empty. A job's other rows count as accepted when it completes.

use std::{collections::HashMap, sync::atomic::Ordering, time::Instant};

use axum::{
    http::{HeaderMap, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use crate::{
    TargetState, accept,
    jobs::{JobEnd, JobsConfig},
    json_reply, lock,
    vendors::record_keys,
};

/// One ingest job.
pub(crate) struct Ingest {
    config: JobsConfig,
    /// When it was closed (`UploadComplete`); `None`: open.
    closed: Option<Instant>,
    aborted: bool,
    /// The uploaded header and rows.
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    /// Each row's key for the accepted-write log.
    keys: Vec<String>,
    counted: bool,
}

/// The ingest jobs of a target, by id.
#[derive(Default)]
pub(crate) struct Ingests {
    by_id: HashMap<String, Ingest>,
    next: u64,
}

fn error(status: u16, code: &str, message: &str) -> Response {
    json_reply(status, json!([{"errorCode": code, "message": message}]))
}

/// The answer to a request for the ingest endpoints, or `None` when `path` is none of theirs.
pub(crate) fn answer(
    s: &TargetState,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
    arrived: Instant,
) -> Option<Response> {
    let segments: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let at = segments.windows(2).position(|w| w == ["jobs", "ingest"])?;
    let rest = &segments[at + 2..];
    let config = lock(&s.jobs).config;
    let mut jobs = lock(&s.ingests);
    Some(match (method.as_str(), rest) {
        ("POST", []) => open(&mut jobs, config, body),
        ("PUT", [id, "batches"]) => upload(&mut jobs, id, headers, body),
        ("PATCH", [id]) => close(&mut jobs, id, body),
        ("GET", [id]) => {
            s.job_polls.fetch_add(1, Ordering::SeqCst);
            status(s, &mut jobs, id, arrived)
        }
        ("GET", [id, "failedResults"]) => failed(&jobs, id),
        _ => error(405, "METHOD_NOT_ALLOWED", "not an ingest endpoint"),
    })
}

fn open(jobs: &mut Ingests, config: JobsConfig, body: &[u8]) -> Response {
    let Ok(spec) = serde_json::from_slice::<Value>(body) else {
        return error(400, "INVALIDJOB", "the job's specification is not JSON");
    };
    if spec["contentType"] != "CSV" || spec["object"].as_str().is_none() {
        return error(400, "INVALIDJOB", "object and contentType CSV are required");
    }
    if spec["operation"] == "upsert" && spec["externalIdFieldName"].as_str().is_none() {
        return error(400, "INVALIDJOB", "an upsert names its externalIdFieldName");
    }
    jobs.next += 1;
    let id = format!("750x{:011}", jobs.next);
    let job = Ingest {
        config,
        closed: None,
        aborted: false,
        header: Vec::new(),
        rows: Vec::new(),
        keys: Vec::new(),
        counted: false,
    };
    jobs.by_id.insert(id.clone(), job);
    json_reply(
        200,
        json!({"id": id, "state": "Open", "object": spec["object"], "operation": spec["operation"],
               "externalIdFieldName": spec["externalIdFieldName"], "contentType": "CSV",
               "apiVersion": 62.0}),
    )
}

fn upload(jobs: &mut Ingests, id: &str, headers: &HeaderMap, body: &[u8]) -> Response {
    let csv = headers
        .get(header::CONTENT_TYPE)
        .and_then(|t| t.to_str().ok())
        .is_some_and(|t| t.starts_with("text/csv"));
    let Some(job) = jobs.by_id.get_mut(id) else {
        return error(404, "NOT_FOUND", "no such job");
    };
    if !csv {
        return error(
            400,
            "INVALIDCONTENT",
            "the upload's content type is not text/csv",
        );
    }
    if job.closed.is_some() || !job.header.is_empty() {
        return error(
            409,
            "INVALIDSTATE",
            "a job takes one upload, while it is open",
        );
    }
    let mut reader = csv::Reader::from_reader(body);
    let Ok(header) = reader
        .headers()
        .map(|h| h.iter().map(str::to_owned).collect())
    else {
        return error(400, "INVALIDCONTENT", "the CSV has no header line");
    };
    let rows: Result<Vec<Vec<String>>, _> = reader
        .records()
        .map(|r| r.map(|r| r.iter().map(str::to_owned).collect()))
        .collect();
    let Ok(rows) = rows else {
        return error(400, "INVALIDCONTENT", "the CSV cannot be read");
    };
    job.keys = record_keys(headers, rows.len(), id).0;
    job.header = header;
    job.rows = rows;
    StatusCode::CREATED.into_response()
}

fn close(jobs: &mut Ingests, id: &str, body: &[u8]) -> Response {
    let Some(job) = jobs.by_id.get_mut(id) else {
        return error(404, "NOT_FOUND", "no such job");
    };
    let asked = serde_json::from_slice::<Value>(body).ok();
    match asked.as_ref().and_then(|b| b["state"].as_str()) {
        Some("UploadComplete") if job.closed.is_none() => job.closed = Some(Instant::now()),
        Some("Aborted") => job.aborted = true,
        _ => {
            return error(
                400,
                "INVALIDSTATE",
                "state UploadComplete (once) or Aborted",
            );
        }
    }
    json_reply(200, json!({"id": id, "state": state(job, Instant::now())}))
}

/// A job's state now.
fn state(job: &Ingest, now: Instant) -> &'static str {
    let Some(closed) = job.closed else {
        return if job.aborted { "Aborted" } else { "Open" };
    };
    let elapsed = now.saturating_duration_since(closed);
    match job.config.end {
        _ if job.aborted => "Aborted",
        _ if elapsed < job.config.complete_after / 2 => "UploadComplete",
        JobEnd::Never => "InProgress",
        _ if elapsed < job.config.complete_after => "InProgress",
        JobEnd::Complete => "JobComplete",
        JobEnd::Cancelled => "Aborted",
    }
}

/// Why row `row` of `job` fails, if it does.
fn failure(job: &Ingest, row: &[String]) -> Option<&'static str> {
    let last = job.header.iter().position(|h| h == "LastName")?;
    row.get(last)
        .is_none_or(String::is_empty)
        .then_some("REQUIRED_FIELD_MISSING:Required fields are missing: [LastName]:LastName --")
}

fn status(s: &TargetState, jobs: &mut Ingests, id: &str, arrived: Instant) -> Response {
    let Some(job) = jobs.by_id.get_mut(id) else {
        return error(404, "NOT_FOUND", "no such job");
    };
    let state = state(job, Instant::now());
    let failed = job
        .rows
        .iter()
        .filter(|r| failure(job, r).is_some())
        .count();
    if state == "JobComplete" && !job.counted {
        job.counted = true;
        for (key, row) in job.keys.iter().zip(&job.rows) {
            if failure(job, row).is_none() {
                accept(s, key, arrived);
            }
        }
    }
    let (processed, failed) = match state {
        "JobComplete" => (job.rows.len(), failed),
        _ => (0, 0),
    };
    json_reply(
        200,
        json!({"id": id, "state": state, "numberRecordsProcessed": processed,
               "numberRecordsFailed": failed}),
    )
}

fn failed(jobs: &Ingests, id: &str) -> Response {
    let Some(job) = jobs.by_id.get(id) else {
        return error(404, "NOT_FOUND", "no such job");
    };
    let mut out = csv::WriterBuilder::new()
        .quote_style(csv::QuoteStyle::Always)
        .from_writer(Vec::new());
    let mut header = vec!["sf__Id".to_owned(), "sf__Error".to_owned()];
    header.extend(job.header.iter().cloned());
    let mut written = out.write_record(&header);
    if state(job, Instant::now()) == "JobComplete" {
        for row in &job.rows {
            if let Some(why) = failure(job, row) {
                let mut line = vec![String::new(), why.to_owned()];
                line.extend(row.iter().cloned());
                written = written.and_then(|()| out.write_record(&line));
            }
        }
    }
    written.expect("CSV writes to memory");
    let body = out.into_inner().expect("CSV writes to memory");
    ([(header::CONTENT_TYPE, "text/csv")], body).into_response()
}
