//! Test helpers, one copy for every test file (the command line's tests include it too):
//! a fresh database per test, dropped with it; an engine with a manual clock; a local
//! target with a connection and rules; bursts of deliveries; and a driver that executes a
//! run's chain jobs step by step.

#![allow(dead_code)]

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use apalis::prelude::{Task, TaskBuilder, TaskId};
use chrono::Utc;
use courier::{
    catalog::{self, NewConnection, NewRule},
    chain::ChainOutcome,
    clock::Clock,
    config::Settings,
    db,
    dispatcher::Dispatcher,
    enqueue::NewDelivery,
    queue::{CHAIN_QUEUE, ChainJob},
    worker::{self, Engine},
};
use courier_target::Target;
use sqlx::{Connection, PgConnection, PgPool};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tower::{Service, ServiceExt};

/// The server tests create their databases on: `COURIER_TEST_DATABASE_URL`, else the
/// local default. The default turns TLS off: PostgreSQL's packages enable it, and a TLS
/// handshake in an unoptimised test build takes about 100 ms per connection, which the
/// suite pays thousands of times over loopback for nothing.
pub fn server_url() -> String {
    std::env::var("COURIER_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable".into())
}

/// The URL of database `name` on [`server_url`]'s server.
pub fn database_url(name: &str) -> String {
    let server = server_url();
    let (server, query) = match server.split_once('?') {
        Some((s, q)) => (s, format!("?{q}")),
        None => (server.as_str(), String::new()),
    };
    let base = server.rsplit_once('/').expect("URL has a database").0;
    format!("{base}/{name}{query}")
}

/// A database of its own for one test, migrated like a real one. It is dropped when the
/// value goes out of scope, unless the test is failing: then it is kept for a look, and
/// its name is printed with the test's output.
pub struct TestDb {
    pub pool: PgPool,
    pub url: String,
    /// Declared last: fields drop in order, so the pool is gone before the database.
    _drop: DropDatabase,
}

impl TestDb {
    pub async fn new() -> Self {
        Self::migrated(None).await
    }

    /// A database with courier's migrations before `version` applied only: what a
    /// database of an older courier holds, for a test of the migrations after it.
    pub async fn migrated_before(version: i64) -> Self {
        Self::migrated(Some(version)).await
    }

    async fn migrated(before: Option<i64>) -> Self {
        // `RUST_LOG=courier=debug cargo test NAME -- --nocapture` shows the engine's log.
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
        let name = format!("courier_test_{:016x}", rand::random::<u64>());
        let url = database_url(&name);
        // Armed before anything can fail, so a failed migration keeps the database too.
        let drop = DropDatabase::new(&name);
        db::create_database(&url).await.expect("test database");
        let pool = db::connect(&url, 10).await.expect("test database");
        db::migrate_before(&pool, before.unwrap_or(i64::MAX))
            .await
            .expect("migrations apply");
        Self {
            pool,
            url,
            _drop: drop,
        }
    }
}

/// Drops the database it names when it goes out of scope; while the thread is panicking
/// (a failing test) it keeps it and prints its name instead.
pub struct DropDatabase {
    name: String,
}

impl DropDatabase {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
        }
    }
}

impl Drop for DropDatabase {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "test failed: keeping its database {} ({})",
                self.name,
                database_url(&self.name)
            );
            return;
        }
        // Drop cannot await, and the test's runtime may be a current-thread one that
        // blocking here would stall: a fresh thread with a runtime of its own does it.
        // WITH (FORCE) ends the connections of pools still alive in the test's tasks.
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the test database")
                .block_on(async {
                    let mut admin = PgConnection::connect(&server_url()).await?;
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                    )))
                    .execute(&mut admin)
                    .await?;
                    admin.close().await
                })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop test database {}: {e}", self.name),
            Err(_) => eprintln!("dropping test database {} panicked", self.name),
        }
    }
}

/// A test database with connection `shop` on a fresh local target, and `rules` on it
/// (see [`setup`]).
pub async fn shop(rules: &[&str], batch: i32, in_flight: i32) -> (TestDb, Target) {
    let db = TestDb::new().await;
    let target = Target::start(0).await.expect("local target");
    setup(&db.pool, &target, rules, batch, in_flight).await;
    (db, target)
}

/// A shop whose first rule has `n` deliveries and a run started, with that run's first
/// chain job taken out of the queue (batch 10, one call in flight): the start of every
/// test that drives one job by hand.
pub async fn one_run(rules: &[&str], n: usize) -> (TestDb, Target, Arc<Engine>, Job) {
    let (db, target) = shop(rules, 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    courier::enqueue::enqueue_many(&db.pool, rules[0], burst("c", n))
        .await
        .expect("enqueue");
    Dispatcher::new(&engine).run_once().await.expect("dispatch");
    let job = take_jobs(&engine).await.remove(0);
    (db, target, engine, job)
}

/// An engine on `pool` with a manual clock a little ahead of the database's `now()`, so
/// rows inserted with default timestamps are due.
pub fn engine(pool: &PgPool, settings: Settings) -> Arc<Engine> {
    let clock = Clock::manual(Utc::now() + chrono::Duration::seconds(5));
    Arc::new(Engine::with_clock(pool.clone(), settings, clock))
}

/// `n` deliveries with record keys `{prefix}:0` .. and small payloads `{"n": i}`.
pub fn burst(prefix: &str, n: usize) -> Vec<NewDelivery> {
    (0..n)
        .map(|i| NewDelivery::new(format!("{prefix}:{i}"), serde_json::json!({"n": i})))
        .collect()
}

/// Settings for tests: defaults with a fast poll.
pub fn settings(url: &str) -> Settings {
    Settings {
        database_url: url.to_owned(),
        queue_poll: std::time::Duration::from_millis(100),
        dispatch_interval: std::time::Duration::from_millis(200),
        ..Settings::default()
    }
}

/// Creates connection `shop` on `target` and rules with the given names and batch size.
pub async fn setup(pool: &PgPool, target: &Target, rules: &[&str], batch: i32, in_flight: i32) {
    catalog::upsert_connection(
        pool,
        &NewConnection {
            name: "shop".into(),
            writer: "http_json".into(),
            base_url: target.url(),
            api_key_env: None,
            headers: Default::default(),
            // Pacing is not what these tests are about: a budget they never exhaust.
            requests_per_minute: Some(600_000),
            max_in_flight: Some(in_flight),
            timeout_ms: Some(5_000),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    for rule in rules {
        catalog::upsert_rule(
            pool,
            &NewRule {
                name: (*rule).into(),
                connection: "shop".into(),
                path: format!("{rule}/"),
                batch_size: Some(batch),
                max_attempts: Some(3),
                backoff_base_ms: Some(1_000),
                backoff_max_ms: Some(60_000),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    }
}

/// A chain job taken out of apalis' table: its row id and payload.
#[derive(Clone, Debug)]
pub struct Job {
    pub id: String,
    pub job: ChainJob,
}

/// Takes every chain job due by `now` out of apalis' table (marking it done, as a worker's
/// acknowledgement would; a snooze puts it back).
pub async fn take_due_jobs(pool: &PgPool, now: chrono::DateTime<Utc>) -> Vec<Job> {
    let rows: Vec<(String, Vec<u8>)> = sqlx::query_as(
        "UPDATE apalis.jobs SET status = 'Done', done_at = now()
         WHERE job_type = $1 AND status = 'Pending' AND run_at <= $2 RETURNING id, job",
    )
    .bind(CHAIN_QUEUE)
    .bind(now)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(id, b)| Job {
            id,
            job: serde_json::from_slice(&b).expect("chain job payload"),
        })
        .collect()
}

/// Takes every queued chain job that is due by `engine`'s clock.
pub async fn take_jobs(engine: &Engine) -> Vec<Job> {
    take_due_jobs(&engine.pool, engine.clock.now()).await
}

/// An apalis task for `job`, as the queue would hand it to the worker.
pub fn task(job: &Job) -> Task<serde_json::Value> {
    TaskBuilder::new(serde_json::to_value(job.job).unwrap())
        .task_id(TaskId::from_string(job.id.clone()))
        .build()
}

/// Runs `job` through the worker's own service stack (throttle layer and chain job).
pub async fn run_job(engine: &Arc<Engine>, job: &Job) -> ChainOutcome {
    try_run_job(engine, job).await.expect("chain job runs")
}

/// Like [`run_job`], returning the service's error.
pub async fn try_run_job(
    engine: &Arc<Engine>,
    job: &Job,
) -> Result<ChainOutcome, apalis::prelude::BoxDynError> {
    worker::chain_service(engine.clone())
        .ready()
        .await?
        .call(task(job))
        .await
}

/// One dispatcher pass, then every chain job until none is left; returns their outcomes.
pub async fn drive(engine: &Arc<Engine>) -> Vec<ChainOutcome> {
    Dispatcher::new(engine).run_once().await.unwrap();
    let mut outcomes = Vec::new();
    for _ in 0..10_000 {
        let jobs = take_due_jobs(&engine.pool, engine.clock.now()).await;
        if jobs.is_empty() {
            return outcomes;
        }
        for job in jobs {
            outcomes.push(run_job(engine, &job).await);
        }
    }
    panic!("chain did not end");
}

/// Each delivery's status and its last ledger row's error, in the order enqueued.
pub async fn status_and_last_error(pool: &PgPool) -> Vec<(String, Option<String>)> {
    sqlx::query_as(
        "SELECT d.status, (SELECT l.error FROM ledger l WHERE l.delivery_id = d.id
                           ORDER BY l.id DESC LIMIT 1)
         FROM deliveries d ORDER BY d.id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// How many deliveries are delivered.
pub async fn delivered(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE status = 'delivered'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// `(status, attempts)` of a delivery.
pub async fn delivery(pool: &PgPool, id: i64) -> (String, i32) {
    sqlx::query_as("SELECT status, attempts FROM deliveries WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// When delivery `id` is due next.
pub async fn next_attempt(pool: &PgPool, id: i64) -> chrono::DateTime<chrono::Utc> {
    sqlx::query_scalar("SELECT next_attempt_at FROM deliveries WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// `(outcome, attempt)` ledger rows of a delivery, oldest first.
pub async fn ledger(pool: &PgPool, id: i64) -> Vec<(String, i32)> {
    sqlx::query_as("SELECT outcome, attempt FROM ledger WHERE delivery_id = $1 ORDER BY id")
        .bind(id)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Polls `cond` every 50 ms until it holds (up to 60 s); for tests that run a real worker.
pub async fn eventually<F, Fut>(what: &str, cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    within(std::time::Duration::from_secs(60), what, cond).await
}

/// Polls `cond` every 50 ms until it holds, failing after `limit`: for a bound that is part
/// of the behaviour (a wait must end when its block lapses, not at some later heartbeat).
pub async fn within<F, Fut>(limit: std::time::Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if cond().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}

// A raw HTTP server for targets that misbehave on purpose (tests/it/hostile.rs): it answers
// what a test tells it to, byte for byte, and keeps every request it read.

/// One request as the server read it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    /// The request line and headers, as sent.
    pub head: String,
    pub body: String,
}

impl Seen {
    /// A header's value (case-insensitive name), empty when absent.
    pub fn header(&self, name: &str) -> String {
        self.head
            .lines()
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
            .unwrap_or_default()
    }
}

/// What the server does with a request.
pub enum Reply {
    /// These bytes, then the connection closes.
    Raw(String),
    /// Nothing, ever: the connection stays open.
    Hang,
    /// A 200 whose JSON body never stops growing, `n` bytes of it, without a length.
    Huge(usize),
}

/// A complete answer: status line, extra header lines (each ending `\r\n`), a body.
pub fn answer(status: &str, headers: &str, body: &str) -> Reply {
    Reply::Raw(format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ))
}

/// A server on `ip` that answers each request with `reply` and keeps what it saw.
pub struct Server {
    pub url: String,
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    pub async fn start(ip: &str, reply: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (kept, reply) = (seen.clone(), Arc::new(reply));
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (kept, reply) = (kept.clone(), reply.clone());
                tokio::spawn(async move { serve(socket, &kept, &*reply).await });
            }
        });
        Self {
            url: format!("http://{addr}/"),
            addr,
            seen,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(
    mut socket: TcpStream,
    kept: &Mutex<Vec<Seen>>,
    reply: &(dyn Fn(&Seen) -> Reply + Sync),
) {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let head_end = loop {
        let Ok(n) = socket.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let seen = Seen {
        path: head
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned(),
        head: head.clone(),
        body: String::from_utf8_lossy(&buf[head_end..]).into_owned(),
    };
    kept.lock().unwrap().push(seen.clone());
    match reply(&seen) {
        Reply::Raw(bytes) => {
            let _ = socket.write_all(bytes.as_bytes()).await;
        }
        Reply::Hang => std::future::pending::<()>().await,
        Reply::Huge(n) => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"access_token\": \"";
            if socket.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let block = vec![b'a'; 64 * 1024];
            let mut sent = 0;
            while sent < n && socket.write_all(&block).await.is_ok() {
                sent += block.len();
            }
        }
    }
}

/// The key every preset's variables hold in these tests ([`preset_keys`]).
pub const PRESET_KEY: &str = "test-key";

/// Sets the variables the presets name (their keys, client ids, site ids: `api_key_env`,
/// `auth.user_env`, `auth.client_id_env` of each connection) to [`PRESET_KEY`], once for
/// the whole test binary: tests of different modules apply the same presets, and one value
/// for each variable keeps them from racing.
pub fn preset_keys() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for preset in courier::presets::PRESETS {
            let c = serde_json::Value::Object(preset.connection(&serde_json::json!({})));
            for var in [
                &c["api_key_env"],
                &c["auth"]["user_env"],
                &c["auth"]["client_id_env"],
            ]
            .into_iter()
            .filter_map(serde_json::Value::as_str)
            {
                // SAFETY: std serialises its own reads and writes of the environment;
                // these variables are written here alone, before any worker reads them.
                unsafe { std::env::set_var(var, PRESET_KEY) };
            }
        }
    });
}

/// Gives every connection the rate signals preset `name` declares: its vendor's headers
/// and limit answers are data, read from the preset.
pub async fn use_preset_signals(pool: &PgPool, name: &str) {
    let c = courier::presets::find(name)
        .unwrap()
        .connection(&serde_json::json!({}));
    let signals = c
        .get("rate_signals")
        .cloned()
        .expect("the preset declares signals");
    sqlx::query("UPDATE connections SET rate_signals = $1")
        .bind(signals)
        .execute(pool)
        .await
        .unwrap();
}

/// Preset `preset`'s file with rule `rule` alone, its connection pointed at `target` (an
/// OAuth token URL too), a job's first poll after a second rather than the preset's wait;
/// the presets' keys set.
pub fn preset_rule(
    preset: &courier::presets::Preset,
    rule: &str,
    target: &str,
) -> serde_json::Value {
    preset_keys();
    let mut file: serde_json::Value = serde_json::from_str(preset.text).unwrap();
    let connection = &mut file["connections"][0];
    // The vendor's own path prefix kept (`v3/`, `crm/rest/v1/`): the target's emulations
    // tell vendors' endpoints apart by it.
    let base = connection["base_url"].as_str().unwrap_or_default();
    let prefix = base
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map_or("", |(_, path)| path);
    connection["base_url"] = serde_json::json!(format!("{target}{prefix}"));
    if connection["auth"]["kind"] == "oauth" {
        connection["auth"]["token_url"] =
            serde_json::json!(format!("{target}services/oauth2/token"));
    }
    file["rules"]
        .as_array_mut()
        .unwrap()
        .retain(|r| r["name"] == rule);
    if file["rules"][0]["job"].is_object() {
        file["rules"][0]["job"]["first_poll_seconds"] = serde_json::json!(1);
    }
    file
}

/// Test settings with an erasure key (`COURIER_ERASURE_KEY`).
pub fn erasing(url: &str) -> Settings {
    Settings {
        erasure_key: Some(
            courier::erasure::ErasureKey::new("an-erasure-key-for-the-tests-only-0123456789")
                .unwrap(),
        ),
        ..settings(url)
    }
}

/// Asks to erase `person` and runs the eraser's passes, the clock 6 s on after each, until
/// the erasure closes (at most 20 passes); returns its id.
pub async fn erase(engine: &Arc<Engine>, person: &courier::erasure::Person) -> i64 {
    let id = courier::erasure::request(&engine.pool, person, "a test")
        .await
        .unwrap();
    let eraser = courier::erasure::eraser::Eraser::new(engine);
    for _ in 0..20 {
        eraser.run_once().await.unwrap();
        let status: String = sqlx::query_scalar("SELECT status FROM erasures WHERE id = $1")
            .bind(id)
            .fetch_one(&engine.pool)
            .await
            .unwrap();
        if status == "done" {
            return id;
        }
        engine.clock.advance(chrono::Duration::seconds(6));
    }
    panic!("erasure {id} did not close");
}

/// Erasure `id`'s part at its one connection: `(outcome, the answer's status)`.
pub async fn erased_part(pool: &PgPool, id: i64) -> (String, Option<i16>) {
    sqlx::query_as("SELECT outcome, http_status FROM erasure_targets WHERE erasure_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}
