//! Asynchronous bulk jobs, as a vendor runs them: how is data, in the `jobs` of a preset's
//! emulation file (`presets/<name>.target.json`, see [`JobEmulation`]), the same for every
//! vendor. A job is created (its records in the create call's body at a pointer, or
//! uploaded as CSV by a later call), closed when the vendor asks for that, and then runs on
//! the clock of [`JobsConfig`]: `queued` for the first half of
//! [`JobsConfig::complete_after`], `processing` after, then `complete` (or `cancelled`, or
//! never, as [`JobsConfig::end`] says), each state under the vendor's own name. Once
//! complete, its failed records are listed: JSON pages with links, or one CSV. A record
//! fails when it is marked `"invalid": true` (on itself or one level down) or when a field
//! the job requires is empty. A job's other records count as accepted when it completes
//! (never for a cancelled one).

use std::{
    collections::HashMap,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use axum::{
    http::{HeaderMap, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::{
    Limiter, RetryAfterMode, TargetState, Window,
    emulation::{JobEmulation, Records, States, Step, emulations},
    limiter, lock,
    server::{accept, json_reply, throttled_response},
    vendors::{Batch, invalid, record_keys},
};

/// How emulated jobs end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobEnd {
    /// `complete`, with an error per invalid record.
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
    /// From the start (the create call, or the close call where there is one) to the end
    /// (`queued` for the first half, `processing` after).
    pub complete_after: Duration,
    /// How a job ends.
    pub end: JobEnd,
    /// Whether each call (create, upload, close, status, errors: each on its own) is
    /// limited as its emulation's `limits` say, on fixed windows, answered 429 with
    /// `Retry-After` in whole seconds; `false`: no limit.
    pub limited: bool,
}

impl Default for JobsConfig {
    fn default() -> Self {
        Self {
            complete_after: Duration::from_secs(2),
            end: JobEnd::Complete,
            limited: false,
        }
    }
}

/// The limits of each call of the jobs `emulation` runs (`presets/<name>.target.json`), as
/// `(limit, period)`: empty when it states none (or has no jobs). A limit that does not
/// parse fails the test reading every emulation.
pub fn call_limits(emulation: &str) -> Vec<(u32, Duration)> {
    let Some((_, e)) = crate::emulation::named(emulation) else {
        return Vec::new();
    };
    e.jobs
        .iter()
        .filter_map(|j| j.limits.as_ref())
        .flat_map(|l| &l.each_call)
        .filter_map(|l| limiter::parse_rate(l).ok())
        .collect()
}

/// Where in its life a job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Open,
    Queued,
    Processing,
    Complete,
    Cancelled,
}

impl States {
    fn name(&self, phase: Phase) -> &str {
        match phase {
            Phase::Open => self.open.as_deref().unwrap_or(&self.queued),
            Phase::Queued => &self.queued,
            Phase::Processing => &self.processing,
            Phase::Complete => &self.complete,
            Phase::Cancelled => &self.cancelled,
        }
    }
}

/// One job as submitted.
pub(crate) struct Job {
    emulation: &'static JobEmulation,
    /// Its number (its id without the prefix).
    number: u64,
    config: JobsConfig,
    /// When it started running: created, or closed; `None`: open.
    started: Option<Instant>,
    aborted: bool,
    /// Its records (a CSV row as an object by column).
    records: Vec<Value>,
    /// The uploaded CSV: its header and rows as sent.
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    /// Each record's key for the accepted-write log.
    keys: Vec<String>,
    /// Whether each record fails.
    invalid: Vec<bool>,
    /// Whether its valid records were counted as accepted.
    counted: bool,
}

/// The jobs of a target, by id.
#[derive(Default)]
pub(crate) struct Jobs {
    pub(crate) config: JobsConfig,
    by_id: HashMap<String, Job>,
    next: u64,
    /// Each endpoint's limiters, made as first called.
    limiters: HashMap<(usize, Role), Vec<Limiter>>,
}

/// Which call of a job a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Role {
    Create,
    Upload,
    Close,
    Status,
    Errors,
}

/// Whether `endpoint` may be called now under `config`'s limits; the wait when not.
fn admitted(jobs: &mut Jobs, endpoint: (usize, Role), now: Instant) -> Result<(), Duration> {
    if !jobs.config.limited {
        return Ok(());
    }
    let limiters = jobs.limiters.entry(endpoint).or_insert_with(|| {
        emulation(endpoint.0)
            .limits
            .iter()
            .flat_map(|l| &l.each_call)
            .filter_map(|l| limiter::parse_rate(l).ok())
            .map(|(n, period)| Limiter::new(n, period, Window::Fixed))
            .collect()
    });
    limiter::admit_all(limiters, now)
}

/// The job id in `path` if it matches `pattern` (`**` first: any prefix; `*` one segment;
/// `{id}` the id): `Some(None)` for a match without an id.
fn matched(pattern: &str, path: &str) -> Option<Option<String>> {
    let p: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty()).collect();
    let s: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (p, s) = match p.split_first() {
        Some((&"**", rest)) if s.len() >= rest.len() => (rest, &s[s.len() - rest.len()..]),
        _ if p.len() == s.len() => (&p[..], &s[..]),
        _ => return None,
    };
    let mut id = None;
    for (a, b) in p.iter().zip(s) {
        match *a {
            "{id}" => id = Some((*b).to_owned()),
            "*" => {}
            a if a == *b => {}
            _ => return None,
        }
    }
    Some(id)
}

/// The emulated job call `path` is, if any: the emulation's index, the call, the id.
/// A job call found: the emulation's index, the call, the id in the path.
type Found = (usize, Role, Option<String>);

/// `Err` with the emulation's index: its path, another method.
fn find(method: &Method, path: &str) -> Option<Result<Found, usize>> {
    let mut path_only = None;
    for (i, e) in emulations().iter().flat_map(|(_, e)| &e.jobs).enumerate() {
        let steps = [
            (
                Role::Create,
                Some(e.create.method.as_str()),
                Some(&e.create.path),
            ),
            (
                Role::Upload,
                e.upload.as_ref().map(|u| u.method.as_str()),
                e.upload.as_ref().map(|u| &u.path),
            ),
            (
                Role::Close,
                e.close.as_ref().map(|c| c.method.as_str()),
                e.close.as_ref().map(|c| &c.path),
            ),
            (
                Role::Status,
                Some(e.status.method.as_str()),
                Some(&e.status.path),
            ),
            (Role::Errors, Some("GET"), Some(&e.errors.path)),
        ];
        for (role, m, p) in steps {
            let (Some(m), Some(p)) = (m, p) else { continue };
            if let Some(id) = matched(p, path) {
                if m == method.as_str() {
                    return Some(Ok((i, role, id)));
                }
                path_only = Some(i);
            }
        }
    }
    path_only.map(Err)
}

fn emulation(i: usize) -> &'static JobEmulation {
    emulations()
        .iter()
        .flat_map(|(_, e)| &e.jobs)
        .nth(i)
        .expect("a job emulation by index")
}

/// A request as a job call sees it.
pub(crate) struct Request<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
    pub body: &'a [u8],
    pub arrived: Instant,
}

/// The answer to a request for an emulated job's endpoints, or `None` when `path` is none
/// of theirs.
pub(crate) fn answer(s: &TargetState, r: &Request<'_>) -> Option<Response> {
    let (i, role, id) = match find(r.method, r.path)? {
        Ok(found) => found,
        Err(i) => {
            let e = emulation(i);
            return Some(error(e, 405, "METHOD_NOT_ALLOWED", "not a job endpoint"));
        }
    };
    let e = emulation(i);
    if let Err(wait) = admitted(&mut lock(&s.jobs), (i, role), Instant::now()) {
        lock(&s.inner).throttled += 1;
        return Some(throttled_response(wait, RetryAfterMode::Seconds));
    }
    let form = match &e.create.records {
        Some(Records::Multipart(file)) if role == Role::Create => match multipart(r, file) {
            Ok(form) => Some(form),
            Err(why) => return Some(error(e, 400, "INVALID_CONTENT", &why)),
        },
        _ => None,
    };
    let body: Option<Value> = match &form {
        Some((fields, _)) => Some(fields.clone()),
        None => serde_json::from_slice(r.body).ok(),
    };
    if role == Role::Create {
        let file = form.map(|(_, file)| file);
        return Some(create(s, e, r, body.as_ref(), file.as_deref()));
    }
    let id = id.unwrap_or_default();
    let mut jobs = lock(&s.jobs);
    let Some(job) = jobs.by_id.get_mut(&id) else {
        return Some(error(e, 404, "NOT_FOUND", "no such job"));
    };
    Some(match role {
        Role::Create => unreachable!("answered above"),
        Role::Upload => upload(job, &id, r),
        Role::Close => close(job, &id, body.as_ref()),
        Role::Status => {
            s.job_polls.fetch_add(1, Ordering::SeqCst);
            status(s, job, &id, r)
        }
        Role::Errors => errors(job, &id, r),
    })
}

fn error(e: &JobEmulation, status: u16, code: &str, message: &str) -> Response {
    let vars = json!({"code": code, "message": message});
    json_reply(status, fill(&[], &[], vars, &e.error, None))
}

/// Template `t` filled for a job's records (`invalid` of each) with `vars`.
fn fill(
    records: &[Value],
    invalid: &[bool],
    vars: Value,
    t: &Value,
    page: Option<(usize, usize)>,
) -> Value {
    batch(records, invalid, vars, page).fill(t, None)
}

/// A job's records (`invalid` of each) with `vars`, as templates see them.
fn batch<'a>(
    records: &'a [Value],
    invalid: &[bool],
    vars: Value,
    page: Option<(usize, usize)>,
) -> Batch<'a> {
    let vars = match vars {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    Batch::of(records, invalid, vars, page)
}

/// The first of `requires` that `body` does not meet, in words.
fn unmet(requires: &Map<String, Value>, body: Option<&Value>) -> Option<String> {
    requires.iter().find_map(|(pointer, want)| {
        let got = body.and_then(|b| b.pointer(pointer));
        let met = match (got, want) {
            (Some(_), Value::String(any)) if any == "*" => true,
            (Some(got), want) => got == want,
            (None, _) => false,
        };
        (!met).then(|| format!("the request needs {pointer} = {want}"))
    })
}

fn create(
    s: &TargetState,
    e: &'static JobEmulation,
    r: &Request<'_>,
    body: Option<&Value>,
    file: Option<&[u8]>,
) -> Response {
    if let Some(why) = unmet(&e.create.requires, body) {
        return error(e, 400, "INVALID_INPUT", &why);
    }
    let csv = match file.map(read_csv) {
        Some(Ok(csv)) => Some(csv),
        Some(Err(why)) => return error(e, 400, "INVALID_CONTENT", why),
        None => None,
    };
    let records = match &e.create.records {
        Some(Records::Multipart(_)) => csv
            .as_ref()
            .map_or_else(Vec::new, |(h, rows)| objects(h, rows)),
        Some(Records::Json(pointer)) => match body
            .and_then(|b| b.pointer(pointer))
            .and_then(Value::as_array)
        {
            Some(records) => records.clone(),
            None => {
                return error(
                    e,
                    400,
                    "INVALID_INPUT",
                    &format!("expected records at {pointer}"),
                );
            }
        },
        _ => Vec::new(),
    };
    let mut jobs = lock(&s.jobs);
    jobs.next += 1;
    let id = format!("{}{:0width$}", e.id_prefix, jobs.next, width = e.id_digits);
    let mut job = Job {
        emulation: e,
        number: jobs.next,
        config: jobs.config,
        started: e.close.is_none().then(Instant::now),
        aborted: false,
        records: Vec::new(),
        header: Vec::new(),
        rows: Vec::new(),
        keys: Vec::new(),
        invalid: Vec::new(),
        counted: false,
    };
    job.take(records, r.headers, &id);
    if let Some((header, rows)) = csv {
        job.header = header;
        job.rows = rows;
    }
    let answer = reply(&job, &id, &e.create, body);
    jobs.by_id.insert(id, job);
    answer
}

impl Job {
    /// Keeps `records` as the job's.
    fn take(&mut self, records: Vec<Value>, headers: &HeaderMap, id: &str) {
        let required = self.emulation.required.as_deref();
        let empty = |r: &Value| {
            required.is_some_and(|p| r.pointer(p).is_none_or(|v| v.is_null() || v == ""))
        };
        self.invalid = records.iter().map(|r| invalid(r) || empty(r)).collect();
        self.keys = record_keys(headers, records.len(), id).0;
        self.records = records;
    }

    fn phase(&self, now: Instant) -> Phase {
        let Some(started) = self.started else {
            return if self.aborted {
                Phase::Cancelled
            } else {
                Phase::Open
            };
        };
        let elapsed = now.saturating_duration_since(started);
        match self.config.end {
            _ if self.aborted => Phase::Cancelled,
            _ if elapsed < self.config.complete_after / 2 => Phase::Queued,
            JobEnd::Never => Phase::Processing,
            _ if elapsed < self.config.complete_after => Phase::Processing,
            JobEnd::Complete => Phase::Complete,
            JobEnd::Cancelled => Phase::Cancelled,
        }
    }

    /// The placeholders of the job's answers now.
    fn vars(&self, id: &str, body: Option<&Value>) -> Value {
        let phase = self.phase(Instant::now());
        let total = self.records.len();
        let failed = self.invalid.iter().filter(|&&i| i).count();
        let done = |n: usize| if phase == Phase::Complete { n } else { 0 };
        json!({"id": id, "number": self.number, "state": self.emulation.states.name(phase),
               "count": total,
               "completed_count": done(total - failed), "failed_count": done(failed),
               "processed_count": done(total), "body": body})
    }
}

/// A step's answer for `job`.
fn reply(job: &Job, id: &str, step: &Step, body: Option<&Value>) -> Response {
    match &step.body {
        Some(t) => json_reply(
            step.status,
            fill(&job.records, &job.invalid, job.vars(id, body), t, None),
        ),
        None => StatusCode::from_u16(step.status)
            .unwrap_or(StatusCode::OK)
            .into_response(),
    }
}

fn upload(job: &mut Job, id: &str, r: &Request<'_>) -> Response {
    let e = job.emulation;
    let csv = r
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|t| t.to_str().ok())
        .is_some_and(|t| t.starts_with("text/csv"));
    if !csv {
        return error(
            e,
            400,
            "INVALID_CONTENT",
            "the upload's content type is not text/csv",
        );
    }
    if job.started.is_some() || job.aborted || !job.header.is_empty() {
        return error(
            e,
            409,
            "INVALID_STATE",
            "a job takes one upload, while it is open",
        );
    }
    let (header, rows) = match read_csv(r.body) {
        Ok(csv) => csv,
        Err(why) => return error(e, 400, "INVALID_CONTENT", why),
    };
    job.take(objects(&header, &rows), r.headers, id);
    job.header = header;
    job.rows = rows;
    let step = e.upload.as_ref().expect("an upload call");
    reply(job, id, step, None)
}

/// CSV with a header line: the header, and each row's cells.
fn read_csv(body: &[u8]) -> Result<(Vec<String>, Vec<Vec<String>>), &'static str> {
    let mut reader = csv::Reader::from_reader(body);
    let header = reader
        .headers()
        .map(|h| h.iter().map(str::to_owned).collect::<Vec<_>>())
        .map_err(|_| "the CSV has no header line")?;
    let rows: Result<Vec<Vec<String>>, _> = reader
        .records()
        .map(|r| r.map(|r| r.iter().map(str::to_owned).collect()))
        .collect();
    Ok((header, rows.map_err(|_| "the CSV cannot be read")?))
}

/// Each CSV row as an object of the header's names.
fn objects(header: &[String], rows: &[Vec<String>]) -> Vec<Value> {
    rows.iter()
        .map(|row| {
            header
                .iter()
                .cloned()
                .zip(row.iter().cloned().map(Value::String))
                .collect::<Map<_, _>>()
                .into()
        })
        .collect()
}

/// A `multipart/form-data` request: its fields other than `file` (each by name, as JSON
/// where it parses, else text) and the bytes of `file`.
fn multipart(r: &Request<'_>, file: &str) -> Result<(Value, Vec<u8>), String> {
    let boundary = r
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|t| t.to_str().ok())
        .filter(|t| t.starts_with("multipart/form-data"))
        .and_then(|t| t.split_once("boundary="))
        .map(|(_, b)| b.trim_matches('"').to_owned())
        .ok_or("the request is not multipart/form-data with a boundary")?;
    let body = String::from_utf8_lossy(r.body);
    let (mut fields, mut found) = (Map::new(), None);
    for part in body.split(&format!("--{boundary}")).skip(1) {
        if part.starts_with("--") {
            break;
        }
        let (head, content) = part
            .trim_start_matches("\r\n")
            .split_once("\r\n\r\n")
            .ok_or("a part has no blank line after its headers")?;
        let content = content.strip_suffix("\r\n").unwrap_or(content);
        let name = head
            .split("name=\"")
            .nth(1)
            .and_then(|n| n.split('"').next())
            .ok_or("a part names no field")?;
        match name == file {
            true => found = Some(content.as_bytes().to_vec()),
            false => {
                let value = serde_json::from_str(content)
                    .unwrap_or_else(|_| Value::String(content.to_owned()));
                fields.insert(name.to_owned(), value);
            }
        }
    }
    let file = found.ok_or_else(|| format!("the form has no {file:?} part"))?;
    Ok((Value::Object(fields), file))
}

fn close(job: &mut Job, id: &str, body: Option<&Value>) -> Response {
    let e = job.emulation;
    let step = e.close.as_ref().expect("a close call");
    let asked = step
        .state_at
        .as_deref()
        .and_then(|p| body.and_then(|b| b.pointer(p)))
        .and_then(Value::as_str);
    match asked {
        Some(s) if s == e.states.queued && job.started.is_none() && !job.aborted => {
            job.started = Some(Instant::now());
        }
        Some(s) if s == e.states.cancelled => job.aborted = true,
        _ => {
            let why = format!("state {} (once) or {}", e.states.queued, e.states.cancelled);
            return error(e, 400, "INVALID_STATE", &why);
        }
    }
    reply(job, id, step, body)
}

fn status(s: &TargetState, job: &mut Job, id: &str, r: &Request<'_>) -> Response {
    let complete = job.phase(Instant::now()) == Phase::Complete;
    if complete && !job.counted {
        job.counted = true;
        for (key, _) in job.keys.iter().zip(&job.invalid).filter(|(_, bad)| !**bad) {
            accept(s, key, r.arrived);
        }
    }
    let e = job.emulation;
    let mut vars = job.vars(id, None);
    vars["report"] = match &e.errors.file_host {
        Some(_) if complete && job.invalid.contains(&true) => {
            let path = e.errors.path.trim_start_matches("**").replace("{id}", id);
            Value::String(format!("http://{}{path}", other_host(host(r.headers))))
        }
        _ => Value::Null,
    };
    match &e.status.body {
        Some(t) => json_reply(
            e.status.status,
            fill(&job.records, &job.invalid, vars, t, None),
        ),
        None => reply(job, id, &e.status, None),
    }
}

/// The host a request was sent to.
fn host(headers: &HeaderMap) -> &str {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1")
}

/// The other name of a loopback host (`localhost:8080` for `127.0.0.1:8080`, and back):
/// another origin of the same server.
fn other_host(host: &str) -> String {
    match host.split_once(':') {
        Some(("127.0.0.1", port)) => format!("localhost:{port}"),
        Some(("localhost", port)) => format!("127.0.0.1:{port}"),
        _ if host == "127.0.0.1" => "localhost".into(),
        _ => host.replacen("localhost", "127.0.0.1", 1),
    }
}

/// The failed records of a complete job (none before): a page of JSON, or one CSV.
fn errors(job: &Job, id: &str, r: &Request<'_>) -> Response {
    let e = &job.emulation.errors;
    if let Some(files) = &e.file_host
        && let Some(sent) = files
            .refuses
            .iter()
            .find(|h| r.headers.contains_key(h.as_str()))
    {
        let why = format!("the file host got the API's {sent} header");
        return error(job.emulation, 400, "CREDENTIALS_ELSEWHERE", &why);
    }
    let complete = job.phase(Instant::now()) == Phase::Complete;
    let failed: Vec<usize> = (0..job.records.len())
        .filter(|&j| complete && job.invalid[j])
        .collect();
    if let Some(columns) = &e.csv {
        return csv_errors(job, id, columns, &failed);
    }
    let param = |name: &str| {
        r.query?
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| decode(k) == name)
            .and_then(|(_, v)| v.parse::<usize>().ok())
    };
    let (size, from) = match &e.page {
        Some(p) => (
            param(&p.size_param).unwrap_or(p.size).clamp(1, p.max),
            param(&p.cursor_param).unwrap_or(0),
        ),
        None => (usize::MAX, 0),
    };
    let host = host(r.headers);
    let link = |cursor: usize| match &e.page {
        Some(p) => Value::String(format!(
            "http://{host}{}?{}={size}&{}={cursor}",
            r.path,
            encode(&p.size_param),
            encode(&p.cursor_param)
        )),
        None => Value::String(format!("http://{host}{}", r.path)),
    };
    let next = match from.saturating_add(size) < failed.len() {
        true => link(from + size),
        false => Value::Null,
    };
    let mut vars = job.vars(id, None);
    vars["self"] = link(from);
    vars["next_cursor"] = match next.is_null() {
        true => Value::Null,
        false => Value::String((from + size).to_string()),
    };
    vars["next"] = next;
    let invalid: Vec<bool> = (0..job.records.len())
        .map(|j| complete && job.invalid[j])
        .collect();
    let body = e.body.as_ref().map_or(Value::Null, |t| {
        fill(&job.records, &invalid, vars, t, Some((from, size)))
    });
    json_reply(200, body)
}

/// The failed rows as CSV: `columns` (templates per row), then the uploaded ones.
fn csv_errors(job: &Job, id: &str, columns: &[(String, String)], failed: &[usize]) -> Response {
    let mut out = csv::WriterBuilder::new()
        .quote_style(csv::QuoteStyle::Always)
        .from_writer(Vec::new());
    let mut header: Vec<String> = columns.iter().map(|(name, _)| name.clone()).collect();
    header.extend(job.header.iter().cloned());
    let mut written = out.write_record(&header);
    let b = batch(&job.records, &job.invalid, job.vars(id, None), None);
    for &j in failed {
        let mut line: Vec<String> = columns
            .iter()
            .map(|(_, t)| match b.fill(&Value::String(t.clone()), Some(j)) {
                Value::String(s) => s,
                Value::Null => String::new(),
                v => v.to_string(),
            })
            .collect();
        line.extend(job.rows.get(j).into_iter().flatten().cloned());
        written = written.and_then(|()| out.write_record(&line));
    }
    written.expect("CSV writes to memory");
    let body = out.into_inner().expect("CSV writes to memory");
    ([(header::CONTENT_TYPE, "text/csv")], body).into_response()
}

/// `page%5Bsize%5D` as `page[size]`.
fn decode(s: &str) -> String {
    s.replace("%5B", "[")
        .replace("%5D", "]")
        .replace("%5b", "[")
        .replace("%5d", "]")
}

/// `page[size]` as `page%5Bsize%5D`.
fn encode(s: &str) -> String {
    s.replace('[', "%5B").replace(']', "%5D")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_paths_match_at_their_end_and_name_the_id() {
        for (pattern, path, want) in [
            (
                "**/jobs/ingest",
                "/services/data/v62.0/jobs/ingest",
                Some(None),
            ),
            (
                "**/jobs/ingest/{id}",
                "/x/jobs/ingest/750x1",
                Some(Some("750x1")),
            ),
            ("**/jobs/ingest/{id}", "/x/jobs/ingest/750x1/batches", None),
            ("**/jobs/{id}/errors", "jobs/j-2/errors/", Some(Some("j-2"))),
            ("api/jobs", "v1/api/jobs", None),
        ] {
            assert_eq!(
                matched(pattern, path),
                want.map(|id| id.map(str::to_owned)),
                "{pattern} {path}"
            );
        }
    }

    #[test]
    fn every_job_emulation_names_its_calls_and_their_states() {
        let all: Vec<&JobEmulation> = emulations().iter().flat_map(|(_, e)| &e.jobs).collect();
        assert!(all.len() >= 2, "two vendors run jobs, at least");
        for e in all {
            let uploads = e.upload.as_ref().and_then(|u| u.records.as_ref());
            let carried = matches!(
                e.create.records,
                Some(Records::Json(_) | Records::Multipart(_))
            ) || matches!(uploads, Some(Records::Csv));
            assert!(carried, "{}: its records come in a call", e.id_prefix);
            assert_eq!(
                e.close.is_some(),
                e.states.open.is_some(),
                "{}: open is the state before close",
                e.id_prefix
            );
            assert!(
                e.close.as_ref().is_none_or(|c| c.state_at.is_some()),
                "{}",
                e.id_prefix
            );
            assert!(
                e.errors.body.is_some() != e.errors.csv.is_some(),
                "{}: JSON or CSV errors",
                e.id_prefix
            );
            if let Some(l) = &e.limits {
                assert!(
                    l.source.len() > 20,
                    "{}: limits name no source",
                    e.id_prefix
                );
                assert!(!l.each_call.is_empty(), "{}", e.id_prefix);
                for rate in &l.each_call {
                    let parsed = limiter::parse_rate(rate);
                    assert!(parsed.is_ok(), "{}: {rate}: {parsed:?}", e.id_prefix);
                }
            }
        }
    }

    #[test]
    fn a_limited_jobs_call_is_refused_past_its_emulations_limits_each_on_its_own() {
        let (i, limited) = emulations()
            .iter()
            .flat_map(|(_, e)| &e.jobs)
            .enumerate()
            .find(|(_, e)| e.limits.is_some())
            .expect("an emulation limits its job calls");
        let limits: Vec<(u32, Duration)> = limited
            .limits
            .as_ref()
            .unwrap()
            .each_call
            .iter()
            .map(|l| limiter::parse_rate(l).unwrap())
            .collect();
        let &(burst, period) = limits.iter().min_by_key(|(_, p)| *p).unwrap();
        let t0 = Instant::now();
        let mut jobs = Jobs::default();
        for _ in 0..burst * 3 {
            assert_eq!(
                admitted(&mut jobs, (i, Role::Status), t0),
                Ok(()),
                "not limited"
            );
        }
        jobs.config.limited = true;
        for n in 0..burst {
            assert_eq!(
                admitted(&mut jobs, (i, Role::Status), t0),
                Ok(()),
                "call {n}"
            );
        }
        let wait = admitted(&mut jobs, (i, Role::Status), t0).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= period, "{wait:?}");
        // Another call of the same job has its own.
        assert_eq!(admitted(&mut jobs, (i, Role::Errors), t0), Ok(()));
        let name = emulations()
            .iter()
            .find(|(_, e)| e.jobs.iter().any(|j| std::ptr::eq(j, limited)));
        assert_eq!(call_limits(name.unwrap().0), limits);
    }
}
