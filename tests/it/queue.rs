//! The chain queue as a worker consumes it: rows apalis cannot read are set aside once and
//! never stop delivery; a worker fetches what was announced before its listener listened,
//! or while its listener's connection was gone, without waiting for the safety-net poll;
//! a statement inserting many jobs announces each due queue once; the jobs the dispatcher
//! writes in SQL read back as chain jobs; a worker fetches when there is a reason to, not
//! at every wake of the jobs it runs.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::common::*;
use courier::{
    db, enqueue,
    queue::{CHAIN_JOB_MAX_ATTEMPTS, CHAIN_QUEUE, ChainJob, Fetcher, INSERT_CHANNEL, UNREADABLE},
    worker::{self, Engine},
    {dispatcher::Dispatcher, maintenance::quarantine::Quarantine},
};
use courier_target::Target;
use sqlx::PgPool;
use tokio::sync::Semaphore;
use tracing_subscriber::{Layer, layer::SubscriberExt};

/// The poll interval of these tests: anything that waits for it fails their bounds.
const LONG_POLL: Duration = Duration::from_secs(60);

/// Log messages, kept for counting (tests on a current-thread runtime see every task's).
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<String>>>);

impl Logged {
    /// Captures the log of this thread until the guard drops.
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()))
    }

    /// Messages containing `text`.
    fn matching(&self, text: &str) -> Vec<String> {
        let logged = self.0.lock().unwrap();
        logged
            .iter()
            .filter(|m| m.contains(text))
            .cloned()
            .collect()
    }

    /// How many messages contain `text`.
    fn count(&self, text: &str) -> usize {
        self.matching(text).len()
    }
}

impl<S: tracing::Subscriber> Layer<S> for Logged {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        /// The message, then every other field.
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0.insert_str(0, &format!("{value:?}"));
                } else {
                    self.0.push_str(&format!(" {}={value:?}", field.name()));
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        self.0.lock().unwrap().push(message.0);
    }
}

/// Inserts an apalis row of the chain queue the way a SQL user could: `id`, payload bytes
/// (hex), then `extra` (a statement on the row, `$1` its id) in the same transaction.
async fn insert_job(pool: &PgPool, id: &str, job_hex: &str, extra: &str) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO apalis.jobs (id, job_type, job, status, attempts, max_attempts, run_at, priority)
         VALUES ($1, $2, decode($3, 'hex'), 'Pending', 0, 3, now(), 0)",
    )
    .bind(id)
    .bind(CHAIN_QUEUE)
    .bind(job_hex)
    .execute(&mut *tx)
    .await
    .unwrap();
    if !extra.is_empty() {
        sqlx::query(sqlx::AssertSqlSafe(extra.to_owned()))
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh ULID as apalis writes them.
fn ulid() -> String {
    courier::queue::new_job_id()
}

/// One row of each kind apalis cannot read, with the words its reason must contain.
fn unreadable_rows() -> Vec<(String, String, &'static str, &'static str)> {
    let json = hex(br#"{"run_id": 1, "rule_id": 1}"#);
    vec![
        ("not-a-ulid".into(), json.clone(), "", "is not a ULID"),
        (ulid().to_lowercase(), json.clone(), "", "is not a ULID"),
        (ulid(), hex(b"\xff\xfe{}"), "", "not UTF-8 JSON"),
        (ulid(), hex(b"not json"), "", "not UTF-8 JSON"),
        (
            ulid(),
            json.clone(),
            "UPDATE apalis.jobs SET run_at = '-infinity' WHERE id = $1",
            "before 1970",
        ),
        (
            ulid(),
            json.clone(),
            "UPDATE apalis.jobs SET metadata = 'k=>NULL'::hstore WHERE id = $1",
            "metadata key 'k' is NULL",
        ),
        // PostgreSQL's json takes a lone surrogate escape, serde_json does not: only the
        // worker's own decoding can catch this one.
        (ulid(), hex(br#"{"a": "\ud800"}"#), "", "not UTF-8 JSON"),
    ]
}

/// `(status, last_result)` of an apalis row.
async fn job_state(pool: &PgPool, id: &str) -> (String, Option<String>) {
    sqlx::query_as("SELECT status, last_result->>'Err' FROM apalis.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_quarantine_sets_every_unreadable_row_aside_once_with_its_reason() {
    let (db, _target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    let rows = unreadable_rows();
    for (id, job, extra, _) in &rows {
        insert_job(&db.pool, id, job, extra).await;
    }
    let readable = ulid();
    insert_job(
        &db.pool,
        &readable,
        &hex(br#"{"run_id": 1, "rule_id": 1}"#),
        "",
    )
    .await;

    let set_aside = Quarantine::new(&engine).run_once().await.unwrap();
    // All but the lone surrogate, which PostgreSQL's json accepts.
    let sql_readable = &rows[rows.len() - 1].0;
    let mut expected: Vec<&String> = rows
        .iter()
        .map(|r| &r.0)
        .filter(|id| *id != sql_readable)
        .collect();
    expected.sort();
    let mut got: Vec<&String> = set_aside.iter().map(|s| &s.id).collect();
    got.sort();
    assert_eq!(got, expected);
    for (id, _, _, words) in &rows[..rows.len() - 1] {
        let (status, reason) = job_state(&db.pool, id).await;
        assert_eq!(status, "Killed", "{id}");
        let reason = reason.unwrap_or_default();
        assert!(
            reason.starts_with(UNREADABLE) && reason.contains(words),
            "{id}: {reason}"
        );
    }
    assert_eq!(job_state(&db.pool, &readable).await.0, "Pending");
    assert_eq!(job_state(&db.pool, sql_readable).await.0, "Pending");
    assert!(
        Quarantine::new(&engine)
            .run_once()
            .await
            .unwrap()
            .is_empty(),
        "a row is set aside once"
    );
}

#[tokio::test]
async fn unreadable_rows_are_set_aside_once_and_never_restart_the_worker() {
    let logged = Logged::default();
    let _log = logged.capture();
    let (db, target) = shop(&["customers"], 10, 2).await;
    let mut rows = unreadable_rows();
    // Half before the worker starts, half while it runs (announced by apalis' trigger).
    let later = rows.split_off(rows.len() / 2);
    for (id, job, extra, _) in &rows {
        insert_job(&db.pool, id, job, extra).await;
    }
    let mut settings = settings(&db.url);
    settings.queue_poll = LONG_POLL;
    let engine = Arc::new(Engine::new(db.pool.clone(), settings));
    let fetcher = Fetcher::new();
    let handle = tokio::spawn(worker::run_with(engine.clone(), fetcher.clone()));
    enqueue::enqueue_many(&db.pool, "customers", burst("a", 20))
        .await
        .unwrap();
    let pool = db.pool.clone();
    eventually("the first 20 delivered", || {
        let pool = pool.clone();
        async move { delivered(&pool).await == 20 }
    })
    .await;
    for (id, job, extra, _) in &later {
        insert_job(&db.pool, id, job, extra).await;
    }
    enqueue::enqueue_many(&db.pool, "customers", burst("b", 20))
        .await
        .unwrap();
    eventually("the next 20 delivered", || {
        let pool = pool.clone();
        async move { delivered(&pool).await == 40 }
    })
    .await;
    rows.extend(later);
    // Rows not due yet (run_at -infinity is due; a row the worker never fetched is left to
    // the quarantine loop): every one must be set aside by now or by one more sweep.
    Quarantine::new(&engine).run_once().await.unwrap();
    for (id, _, _, words) in &rows {
        let (status, reason) = job_state(&db.pool, id).await;
        let reason = reason.unwrap_or_default();
        assert_eq!(status, "Killed", "{id}: {reason}");
        assert!(reason.contains(words), "{id}: {reason}");
    }
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();

    assert_eq!(
        fetcher.restarts(),
        0,
        "no row restarted the worker: {:?}",
        logged.matching("stopped")
    );
    assert_eq!(logged.count("chain worker stopped"), 0);
    assert_eq!(
        logged.count(UNREADABLE),
        rows.len(),
        "each row logged once: {:?}",
        logged.0.lock().unwrap()
    );
    assert_eq!(target.counters().accepted_keys, 40);
}

#[tokio::test]
async fn a_worker_that_keeps_failing_restarts_after_growing_pauses_not_in_a_loop() {
    let logged = Logged::default();
    let _log = logged.capture();
    let (db, _target) = shop(&["customers"], 10, 2).await;
    // Every fetch fails, for a reason no sweep can fix.
    sqlx::query("ALTER FUNCTION apalis.get_jobs(text, text, integer) RENAME TO get_jobs_gone")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut settings = settings(&db.url);
    settings.queue_poll = LONG_POLL;
    let engine = Arc::new(Engine::new(db.pool.clone(), settings));
    let fetcher = Fetcher::new();
    let handle = tokio::spawn(worker::run_with(engine.clone(), fetcher.clone()));
    let restarted = || fetcher.restarts() > 0;
    within(
        Duration::from_secs(10),
        "the worker failed once",
        || async { restarted() },
    )
    .await;
    // The measurement is the window itself: apalis' Monitor restarted it about 50 times a
    // second; pauses of 0.25, 0.5, 1, 2 s allow 4 or 5 restarts in 4 s.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let restarts = fetcher.restarts();
    assert!((2..=6).contains(&restarts), "{restarts} restarts in 4 s");
    assert!(logged.count("chain worker stopped") as u64 <= restarts + 1);

    sqlx::query("ALTER FUNCTION apalis.get_jobs_gone(text, text, integer) RENAME TO get_jobs")
        .execute(&db.pool)
        .await
        .unwrap();
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 5))
        .await
        .unwrap();
    let pool = db.pool.clone();
    within(
        Duration::from_secs(15),
        "delivered once fetching works",
        || {
            let pool = pool.clone();
            async move { delivered(&pool).await == 5 }
        },
    )
    .await;
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();
}

/// Starts a worker with its queue listener held back (no permits yet) and a long poll;
/// returns once its first fetch completed, before the listener listens.
async fn worker_with_listener_held(
    db: &TestDb,
) -> (
    Arc<Engine>,
    Arc<Fetcher>,
    Arc<Semaphore>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let mut settings = settings(&db.url);
    settings.queue_poll = LONG_POLL;
    let engine = Arc::new(Engine::new(db.pool.clone(), settings));
    let gate = Arc::new(Semaphore::new(0));
    let fetcher = Fetcher::gated(gate.clone());
    let handle = tokio::spawn(worker::run_with(engine.clone(), fetcher.clone()));
    let mut fetches = fetcher.fetches();
    tokio::time::timeout(Duration::from_secs(10), fetches.wait_for(|n| *n >= 1))
        .await
        .expect("the worker fetches once registered")
        .unwrap();
    assert_eq!(*fetcher.subscriptions().borrow(), 0, "the listener is held");
    (engine, fetcher, gate, handle)
}

/// Waits until the target has received a request, at most `limit`; returns how long it took.
async fn first_call_within(target: &Target, limit: Duration) -> Duration {
    let start = Instant::now();
    within(limit, "the first call", || async {
        target.counters().requests > 0
    })
    .await;
    start.elapsed()
}

#[tokio::test]
async fn the_dispatcher_starts_each_run_with_one_job_apalis_reads_as_its_chain_job() {
    let rules = ["a", "b", "c"];
    let (db, _target) = shop(&rules, 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    for rule in rules {
        enqueue::enqueue_many(&db.pool, rule, burst(rule, 2))
            .await
            .unwrap();
    }
    let dispatcher = Dispatcher::new(&engine);
    assert_eq!(dispatcher.run_once().await.unwrap(), 3);
    assert_eq!(dispatcher.run_once().await.unwrap(), 0, "one run per rule");
    // The payload is built in SQL: it must read back as the run's own chain job, under an
    // id apalis parses, with the attempts and defaults apalis' own push would write.
    let rows: Vec<(i64, i64, String, Vec<u8>, String)> = sqlx::query_as(
        "SELECT x.id, x.rule_id, j.id, j.job,
                concat_ws(' ', j.status, j.attempts, j.max_attempts, j.priority)
         FROM runs x JOIN apalis.jobs j ON j.id = x.job_id AND j.job_type = $1",
    )
    .bind(CHAIN_QUEUE)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 3, "one job per run");
    for (run_id, rule_id, id, job, state) in rows {
        let job: ChainJob = serde_json::from_slice(&job).expect("a chain job payload");
        assert_eq!(job, ChainJob { run_id, rule_id });
        assert!(ulid::Ulid::from_string(&id).is_ok(), "{id} is a ULID");
        assert_eq!(
            state,
            format!("Pending 0 {CHAIN_JOB_MAX_ATTEMPTS} 0"),
            "status, attempts, max attempts, priority"
        );
    }
    assert!(
        Quarantine::new(&engine)
            .run_once()
            .await
            .unwrap()
            .is_empty(),
        "nothing unreadable"
    );
    assert_eq!(take_jobs(&engine).await.len(), 3, "all due now");
}

#[tokio::test]
async fn a_statement_inserting_many_jobs_announces_each_due_queue_once() {
    let db = TestDb::new().await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&db.pool)
        .await
        .unwrap();
    listener.listen(INSERT_CHANNEL).await.unwrap();
    // Three jobs of the chain queue and two of another, due now, and one for later, in one
    // statement; then a marker in a transaction of its own (notifications arrive in commit
    // order, so everything before it belongs to the insert).
    sqlx::query(
        "INSERT INTO apalis.jobs (id, job_type, job, status, attempts, max_attempts, run_at, priority)
         SELECT md5(random()::text), q, '\\x7b7d', 'Pending', 0, 3, now() + later, 0
         FROM (VALUES ($1, interval '0'), ($1, '0'), ($1, '0'), ('other', '0'), ('other', '0'),
                      ('later', '1 hour')) AS v(q, later)",
    )
    .bind(CHAIN_QUEUE)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(INSERT_CHANNEL)
        .execute(&db.pool)
        .await
        .unwrap();
    let mut queues = Vec::new();
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
            .await
            .expect("the marker arrives")
            .unwrap();
        if n.payload() == "marker" {
            break;
        }
        let payload: serde_json::Value = serde_json::from_str(n.payload()).unwrap();
        queues.push(payload["job_type"].as_str().unwrap().to_owned());
    }
    queues.sort();
    assert_eq!(
        queues,
        [CHAIN_QUEUE, "other"],
        "one announcement per due queue"
    );
    // Every insert maintains the table's indexes: none repeats another's columns.
    let repeated: Vec<String> = sqlx::query_scalar(
        "SELECT string_agg(indexrelid::regclass::text, ', ') FROM pg_index
         WHERE indrelid = 'apalis.jobs'::regclass
         GROUP BY indkey::text, indpred::text HAVING count(*) > 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        repeated.is_empty(),
        "repeated indexes on apalis.jobs: {repeated:?}"
    );
}

#[tokio::test]
async fn a_job_announced_before_the_listener_listens_is_fetched_as_soon_as_it_does() {
    let (db, target) = shop(&["customers"], 10, 2).await;
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 10))
        .await
        .unwrap();
    let (engine, fetcher, gate, handle) = worker_with_listener_held(&db).await;
    // The race of issue 13, forced: the first job is pushed and announced after the
    // worker's first (empty) fetch and before its listener listens.
    assert_eq!(Dispatcher::new(&engine).run_once().await.unwrap(), 1);
    let waiting: i64 =
        sqlx::query_scalar("SELECT count(*) FROM apalis.jobs WHERE status = 'Pending'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(waiting, 1);
    assert_eq!(target.counters().requests, 0);

    gate.add_permits(1);
    let took = first_call_within(&target, Duration::from_secs(5)).await;
    println!("first call {took:?} after the listener was let subscribe");
    assert_eq!(*fetcher.subscriptions().borrow(), 1);
    let pool = db.pool.clone();
    eventually("all 10 delivered", || {
        let pool = pool.clone();
        async move { delivered(&pool).await == 10 }
    })
    .await;
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();
}

#[tokio::test]
async fn jobs_pushed_while_the_listener_was_gone_are_fetched_when_it_is_back() {
    let (db, target) = shop(&["customers"], 10, 2).await;
    let (engine, fetcher, gate, handle) = worker_with_listener_held(&db).await;
    gate.add_permits(1);
    fetcher.listening().await;
    // The listener's connection is lost, and held from coming back.
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE 'LISTEN \"apalis::job::insert\"%'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(killed, vec![true]);

    // The dispatcher (listening on a channel of its own) starts a run and pushes its first
    // job, announced to nobody.
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 10))
        .await
        .unwrap();
    let pool = db.pool.clone();
    eventually("the run's first job pushed", || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM apalis.jobs")
                .fetch_one(&pool)
                .await
                .unwrap()
                == 1
        }
    })
    .await;
    assert_eq!(target.counters().requests, 0);

    gate.add_permits(1);
    let took = first_call_within(&target, Duration::from_secs(5)).await;
    println!("first call {took:?} after the listener was let subscribe again");
    assert_eq!(*fetcher.subscriptions().borrow(), 2);
    eventually("all 10 delivered", || {
        let pool = pool.clone();
        async move { delivered(&pool).await == 10 }
    })
    .await;
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();
}

#[tokio::test]
async fn an_announcement_during_a_fetch_that_cannot_see_its_job_gets_another_fetch() {
    let (db, target) = shop(&["customers"], 10, 2).await;
    // Every fetch reads the queue, then waits for an advisory lock the test holds: a fetch
    // in flight whose snapshot predates what is pushed meanwhile.
    sqlx::raw_sql(
        "ALTER FUNCTION apalis.get_jobs(text, text, integer) RENAME TO get_jobs_now;
         CREATE FUNCTION apalis.get_jobs(worker_id text, v_job_type text, v_job_count integer)
         RETURNS SETOF apalis.jobs LANGUAGE plpgsql AS $$
         BEGIN
             RETURN QUERY SELECT * FROM apalis.get_jobs_now(worker_id, v_job_type, v_job_count);
             PERFORM pg_advisory_lock_shared(4213);
             PERFORM pg_advisory_unlock_shared(4213);
         END $$",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let mut holder = db.pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(4213)")
        .execute(&mut *holder)
        .await
        .unwrap();
    let mut settings = settings(&db.url);
    settings.queue_poll = LONG_POLL;
    let engine = Arc::new(Engine::new(db.pool.clone(), settings));
    let fetcher = Fetcher::new();
    let handle = tokio::spawn(worker::run_with(engine.clone(), fetcher.clone()));
    fetcher.listening().await;
    let pool = db.pool.clone();
    eventually("a fetch held in flight", || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event = 'advisory'",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
                == 1
        }
    })
    .await;
    let rings = fetcher.rings();
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 10))
        .await
        .unwrap();
    // The worker's dispatcher pushes the run's first job; the listener hears it while the
    // fetch is still in flight.
    eventually("the job announced", || async { fetcher.rings() > rings }).await;
    assert_eq!(*fetcher.fetches().borrow(), 0);
    sqlx::query("SELECT pg_advisory_unlock(4213)")
        .execute(&mut *holder)
        .await
        .unwrap();
    let took = first_call_within(&target, Duration::from_secs(5)).await;
    println!("first call {took:?} after the fetch in flight was let finish");
    eventually("all 10 delivered", || {
        let pool = pool.clone();
        async move { delivered(&pool).await == 10 }
    })
    .await;
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_job_scheduled_for_later_by_a_process_now_gone_is_fetched_when_due() {
    let (db, target) = shop(&["customers"], 10, 2).await;
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 10))
        .await
        .unwrap();
    let mut settings = settings(&db.url);
    settings.queue_poll = LONG_POLL;
    let engine = Arc::new(Engine::new(db.pool.clone(), settings));
    // The run's job, scheduled 2 s ahead (a busy lease, a short wait) by a process that
    // died before its timer announced it: no insert, no NOTIFY.
    assert_eq!(Dispatcher::new(&engine).run_once().await.unwrap(), 1);
    sqlx::query("UPDATE apalis.jobs SET run_at = now() + interval '2 seconds'")
        .execute(&db.pool)
        .await
        .unwrap();
    let start = Instant::now();
    let fetcher = Fetcher::new();
    let handle = tokio::spawn(worker::run_with(engine.clone(), fetcher.clone()));
    let took = first_call_within(&target, Duration::from_secs(6)).await;
    println!("first call {took:?} after the start, the job due 2 s after it");
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "not before it was due"
    );
    let pool = db.pool.clone();
    eventually("all 10 delivered", || {
        let pool = pool.clone();
        async move { delivered(&pool).await == 10 }
    })
    .await;
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();
}

/// A throwaway PostgreSQL cluster on a free loopback port, in a temporary directory,
/// stopped and removed on drop (as `courier demo` makes one).
struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// PostgreSQL refuses to run as root: its commands then run as `postgres`.
    as_postgres: bool,
}

impl Cluster {
    /// Starts one, or `None` when no PostgreSQL server binaries are installed.
    fn start() -> Option<Self> {
        let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|bin| bin.join("initdb").is_file() && bin.join("pg_ctl").is_file())
            .collect();
        versions.sort();
        let bin = versions.pop()?;
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
        let dir = std::env::temp_dir().join(format!(
            "courier-test-pg-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cluster = Self {
            bin,
            dir,
            port,
            as_postgres,
        };
        if as_postgres {
            run(Command::new("chown").arg("postgres").arg(&cluster.dir));
        }
        run(cluster
            .command("initdb")
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "-D"])
            .arg(cluster.dir.join("data")));
        run(cluster
            .pg_ctl()
            .arg("-l")
            .arg(cluster.dir.join("log"))
            .arg("-o")
            .arg(format!(
                "-p {port} -c listen_addresses=127.0.0.1 -k {}",
                cluster.dir.display()
            ))
            .args(["-w", "start"]));
        Some(cluster)
    }

    fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}?sslmode=disable",
            self.port
        )
    }

    fn restart(&self) {
        // With a log file: a server started with pg_ctl's output piped would keep the pipe
        // open, and the wait for pg_ctl's output would never end.
        run(self
            .pg_ctl()
            .arg("-l")
            .arg(self.dir.join("log"))
            .args(["-m", "fast", "-w", "restart"]));
    }

    fn pg_ctl(&self) -> Command {
        let mut c = self.command("pg_ctl");
        c.arg("-D").arg(self.dir.join("data"));
        c
    }

    fn command(&self, program: &str) -> Command {
        let program: &Path = &self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .pg_ctl()
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn after_a_database_restart_the_listener_is_back_and_nothing_waits_for_the_poll() {
    // `RUST_LOG=courier=debug cargo test NAME -- --nocapture` shows the engine's log.
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let Some(cluster) = Cluster::start() else {
        panic!("no PostgreSQL server binaries under /usr/lib/postgresql");
    };
    let url = cluster.url("courier");
    db::create_database(&url).await.unwrap();
    let pool = db::connect(&url, 10).await.unwrap();
    db::migrate(&pool).await.unwrap();
    let target = Target::start(0).await.unwrap();
    setup(&pool, &target, &["customers"], 10, 2).await;
    let mut settings = settings(&url);
    settings.queue_poll = LONG_POLL;
    let engine = Arc::new(Engine::new(pool.clone(), settings));
    let fetcher = Fetcher::new();
    let handle = tokio::spawn(worker::run_with(engine.clone(), fetcher.clone()));
    fetcher.listening().await;
    enqueue::enqueue_many(&pool, "customers", burst("before", 5))
        .await
        .unwrap();
    // Idle when the database restarts: what is measured is the listener, not a run cut
    // off as it ends (a lease it could not give back waits to expire: another matter).
    eventually(
        "delivered before the restart, the run ended, its lease free",
        || {
            let pool = pool.clone();
            async move {
                let (n, busy): (i64, i64) = sqlx::query_as(
                    "SELECT (SELECT count(*) FROM deliveries WHERE status = 'delivered'),
                        (SELECT count(*) FROM runs WHERE active)
                        + (SELECT count(*) FROM rules WHERE lease_owner IS NOT NULL)",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                n == 5 && busy == 0
            }
        },
    )
    .await;

    cluster.restart();
    let back = Instant::now();
    // The first statements after a restart may meet connections it closed.
    eventually("enqueued after the restart", || {
        let pool = pool.clone();
        async move {
            enqueue::enqueue_many(&pool, "customers", burst("after", 5))
                .await
                .is_ok()
        }
    })
    .await;
    within(
        Duration::from_secs(15),
        "delivered after the restart",
        || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM deliveries WHERE status = 'delivered'",
                )
                .fetch_one(&pool)
                .await
                .is_ok_and(|n| n == 10)
            }
        },
    )
    .await;
    println!(
        "delivered {:?} after the database answered again",
        back.elapsed()
    );
    assert!(*fetcher.subscriptions().borrow() >= 2, "subscribed again");
    assert_eq!(fetcher.restarts(), 0, "the worker rode out the restart");
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();
    pool.close().await;
    drop(cluster);
}

#[tokio::test]
async fn a_worker_fetches_when_rung_not_at_every_wake_of_the_jobs_it_runs() {
    let (db, _target) = shop(&["customers"], 10, 2).await;
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 30))
        .await
        .unwrap();
    let mut settings = settings(&db.url);
    settings.queue_poll = LONG_POLL;
    let engine = Arc::new(Engine::new(db.pool.clone(), settings));
    let fetcher = Fetcher::new();
    let handle = tokio::spawn(worker::run_with(engine.clone(), fetcher.clone()));
    let pool = db.pool.clone();
    eventually("all 30 delivered", || {
        let pool = pool.clone();
        async move { delivered(&pool).await == 30 }
    })
    .await;
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();
    // Each job is announced (one ring, one fetch) and the fetch after the last one finds
    // nothing; the answers, slots and beats of the jobs in flight ring nothing.
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM apalis.jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let fetches = *fetcher.fetches().borrow();
    println!("{fetches} fetches for {jobs} chain jobs");
    assert!(
        fetches <= 2 * jobs as u64 + 2,
        "{fetches} fetches for {jobs} chain jobs: the worker fetches without a reason"
    );
}
