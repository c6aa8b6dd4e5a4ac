//! Asynchronous bulk jobs, as Klaviyo's profile bulk import runs them: `POST
//! .../profile-bulk-import-jobs` (the profiles at `/data/attributes/profiles/data`) answers
//! 202 with the job (`data.id`, `data.attributes.status` `queued`); `GET .../{id}` says
//! `queued`, then `processing`, then `complete` (or `cancelled`, or never finishes, as
//! [`JobsConfig::end`] says) after [`JobsConfig::complete_after`]; `GET .../{id}/import-errors`
//! lists one error per invalid profile (`"invalid": true` on it or its attributes), each
//! with `source.pointer` into the submitted body, `page[size]` at a time (20 unless
//! asked, at most 100) with an absolute `links.next`. A job's valid profiles count as
//! accepted when it completes (never for a cancelled one).

use std::{
    collections::HashMap,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use axum::{
    http::{HeaderMap, Method},
    response::Response,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{
    Limiter, RetryAfterMode, TargetState, Window, accept, json_reply, lock, throttled_response,
    vendors::{invalid, record_keys},
};

/// How emulated jobs end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobEnd {
    /// `complete`, with an error per invalid profile.
    #[default]
    Complete,
    /// `cancelled`: nothing imported.
    Cancelled,
    /// `processing` forever.
    Never,
}

/// How emulated jobs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobsConfig {
    /// From the submit to the end (`queued` for the first half, `processing` after).
    pub complete_after: Duration,
    /// How a job ends.
    pub end: JobEnd,
    /// Each endpoint's limits (create, get a job, its errors: each its own, as Klaviyo's),
    /// requests per second and per minute on sliding windows, answered 429 with
    /// `Retry-After` in whole seconds; `None`: no limit.
    pub limits: Option<(u32, u32)>,
}

impl Default for JobsConfig {
    fn default() -> Self {
        Self {
            complete_after: Duration::from_secs(2),
            end: JobEnd::Complete,
            limits: None,
        }
    }
}

/// Klaviyo's published limits of each `profile-bulk-import-jobs` endpoint: 10/s burst,
/// 150/min steady.
pub const KLAVIYO_LIMITS: (u32, u32) = (10, 150);

/// One job as submitted.
pub(crate) struct Job {
    created: Instant,
    config: JobsConfig,
    /// The submitted profiles, for the errors' `original_payload`.
    profiles: Vec<Value>,
    /// Each profile's key for the accepted-write log.
    keys: Vec<String>,
    /// Whether each profile is invalid.
    invalid: Vec<bool>,
    /// Whether its valid profiles were counted as accepted.
    counted: bool,
}

/// The jobs of a target, by id.
#[derive(Default)]
pub(crate) struct Jobs {
    pub(crate) config: JobsConfig,
    pub(crate) by_id: HashMap<String, Job>,
    pub(crate) next: u64,
    /// Each endpoint's per-second and per-minute limiters, made as first called.
    limiters: HashMap<&'static str, (Limiter, Limiter)>,
}

/// Whether `endpoint` may be called now under `config`'s limits; the wait when not.
fn admitted(jobs: &mut Jobs, endpoint: &'static str, now: Instant) -> Result<(), Duration> {
    let Some((per_second, per_minute)) = jobs.config.limits else {
        return Ok(());
    };
    let (second, minute) = jobs.limiters.entry(endpoint).or_insert_with(|| {
        (
            Limiter::new(per_second, Duration::from_secs(1), Window::Sliding),
            Limiter::new(per_minute, Duration::from_secs(60), Window::Sliding),
        )
    });
    minute.check(now)?;
    second.check(now)
}

const COLLECTION: &str = "profile-bulk-import-jobs";

/// The answer to a request for the job endpoints, or `None` when `path` is none of theirs.
pub(crate) fn answer(
    s: &TargetState,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Option<&Value>,
    arrived: Instant,
) -> Option<Response> {
    let segments: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let at = segments.iter().rposition(|s| *s == COLLECTION)?;
    let rest = &segments[at + 1..];
    let endpoint = match rest {
        [] => "create",
        [_] => "get",
        _ => "errors",
    };
    if let Err(wait) = admitted(&mut lock(&s.jobs), endpoint, Instant::now()) {
        lock(&s.inner).throttled += 1;
        return Some(throttled_response(wait, RetryAfterMode::Seconds));
    }
    Some(match (method.as_str(), rest) {
        ("POST", []) => submit(s, headers, body),
        ("GET", [id]) => status(s, id, arrived),
        ("GET", [id, "import-errors"]) => errors(s, id, path, query, headers),
        _ => json_reply(405, json!({"errors": [{"detail": "not a job endpoint"}]})),
    })
}

fn submit(s: &TargetState, headers: &HeaderMap, body: Option<&Value>) -> Response {
    let Some(profiles) = body
        .and_then(|b| b.pointer("/data/attributes/profiles/data"))
        .and_then(Value::as_array)
    else {
        return json_reply(
            400,
            json!({"errors": [{"code": "invalid", "title": "Invalid input.",
                   "detail": "expected profiles at /data/attributes/profiles/data",
                   "source": {"pointer": "/data/attributes/profiles/data"}}]}),
        );
    };
    let mut jobs = lock(&s.jobs);
    jobs.next += 1;
    let id = format!("job-{}", jobs.next);
    let job = Job {
        created: Instant::now(),
        config: jobs.config,
        keys: record_keys(headers, profiles.len(), &id).0,
        invalid: profiles.iter().map(invalid).collect(),
        profiles: profiles.clone(),
        counted: false,
    };
    let total = job.profiles.len();
    jobs.by_id.insert(id.clone(), job);
    json_reply(
        202,
        json!({"data": {"type": "profile-bulk-import-job", "id": id,
               "attributes": {"status": "queued", "total_count": total, "completed_count": 0,
                              "failed_count": 0}}}),
    )
}

/// A job's status now.
fn state(job: &Job, now: Instant) -> &'static str {
    let elapsed = now.saturating_duration_since(job.created);
    match job.config.end {
        _ if elapsed < job.config.complete_after / 2 => "queued",
        JobEnd::Never => "processing",
        _ if elapsed < job.config.complete_after => "processing",
        JobEnd::Complete => "complete",
        JobEnd::Cancelled => "cancelled",
    }
}

fn status(s: &TargetState, id: &str, arrived: Instant) -> Response {
    let mut jobs = lock(&s.jobs);
    let Some(job) = jobs.by_id.get_mut(id) else {
        return json_reply(
            404,
            json!({"errors": [{"code": "not_found", "detail": "no such job"}]}),
        );
    };
    let status = state(job, Instant::now());
    let failed = job.invalid.iter().filter(|&&i| i).count();
    let total = job.profiles.len();
    if status == "complete" && !job.counted {
        job.counted = true;
        for (key, _) in job.keys.iter().zip(&job.invalid).filter(|(_, bad)| !**bad) {
            accept(s, key, arrived);
        }
    }
    let (completed, failed) = match status {
        "complete" => (total - failed, failed),
        _ => (0, 0),
    };
    s.job_polls.fetch_add(1, Ordering::SeqCst);
    json_reply(
        200,
        json!({"data": {"type": "profile-bulk-import-job", "id": id,
               "attributes": {"status": status, "total_count": total,
                              "completed_count": completed, "failed_count": failed}}}),
    )
}

fn errors(
    s: &TargetState,
    id: &str,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Response {
    let param = |name: &str| {
        query?
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| decode(k) == name)
            .and_then(|(_, v)| v.parse::<usize>().ok())
    };
    let size = param("page[size]").unwrap_or(20).clamp(1, 100);
    let from = param("page[cursor]").unwrap_or(0);
    let jobs = lock(&s.jobs);
    let Some(job) = jobs.by_id.get(id) else {
        return json_reply(
            404,
            json!({"errors": [{"code": "not_found", "detail": "no such job"}]}),
        );
    };
    let bad: Vec<usize> = (0..job.profiles.len())
        .filter(|&j| job.invalid[j])
        .collect();
    let page: Vec<Value> = bad
        .iter()
        .skip(from)
        .take(size)
        .map(|&j| {
            json!({"type": "import-error", "id": format!("{id}-{j}"),
                   "attributes": {"code": "invalid", "title": "Invalid input.",
                                  "detail": format!("profile {j} is invalid"),
                                  "source": {"pointer": format!("/data/attributes/profiles/data/{j}/attributes/email")},
                                  "original_payload": job.profiles[j]}})
        })
        .collect();
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1");
    let link = |cursor: usize| {
        format!("http://{host}{path}?page%5Bsize%5D={size}&page%5Bcursor%5D={cursor}")
    };
    let mut links = json!({"self": link(from)});
    if from + size < bad.len() {
        links["next"] = Value::String(link(from + size));
    }
    json_reply(200, json!({"data": page, "links": links}))
}

/// `page%5Bsize%5D` as `page[size]`.
fn decode(s: &str) -> String {
    s.replace("%5B", "[")
        .replace("%5D", "]")
        .replace("%5b", "[")
        .replace("%5d", "]")
}
