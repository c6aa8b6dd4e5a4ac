//! Workers come and go (issue #28), with real `courier worker` processes: several on one
//! host with the default settings all run, each at an address of its own that `courier
//! status` lists; a killed holder's work resumes within seconds in a process younger than
//! the liveness window; a start that fails leaves nothing behind.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::common::*;
use sqlx::PgPool;

/// `courier worker` on `url`, its log in `log` (it serves metrics nowhere unless the
/// caller changes `COURIER_HTTP_ADDR` on the command before spawning it).
fn worker(url: &str, log: &PathBuf) -> Command {
    let mut command = courier();
    command
        .arg("worker")
        .env("DATABASE_URL", url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap());
    command
}

fn log_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "courier-workers-test-{}-{:08x}-{name}.log",
        std::process::id(),
        rand::random::<u32>()
    ))
}

/// SIGTERM, then the exit status (SIGKILL after 30 s).
fn stop(child: &mut Child) -> std::process::ExitStatus {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("worker {} did not stop within 30 s", child.id());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills every child left when a test fails half-way.
struct Fleet(Vec<Child>);

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `courier status --json` on `url`.
fn status_json(url: &str) -> serde_json::Value {
    let out = courier_on(url).args(["status", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What a worker leaves in the database: its `workers` rows, apalis' worker rows, rule
/// leases, chain jobs locked by anyone.
async fn left_behind(pool: &PgPool) -> (i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM workers), (SELECT count(*) FROM apalis.workers),
                (SELECT count(*) FROM rules WHERE lease_owner IS NOT NULL),
                (SELECT count(*) FROM apalis.jobs WHERE lock_by IS NOT NULL
                                                    AND status IN ('Queued', 'Running'))",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Three workers started on one host with the default settings (no `COURIER_HTTP_ADDR`)
/// all run and deliver; each serves its metrics at an address of its own, logs it, and
/// `courier status` (table and JSON) lists it; each stops cleanly and removes its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_workers_on_one_host_with_the_defaults_all_run_each_at_its_own_address() {
    let (db, target) = shop(&["a", "b", "c"], 10, 2).await;
    let logs: Vec<PathBuf> = (0..3).map(|i| log_path(&format!("w{i}"))).collect();
    let mut fleet = Fleet(Vec::new());
    for log in &logs {
        let child = worker(&db.url, log)
            .env_remove("COURIER_HTTP_ADDR")
            .spawn()
            .unwrap();
        fleet.0.push(child);
    }
    // Every one runs: none exits at start, all three are listed with an address.
    let mut listed = serde_json::Value::Null;
    eventually("three live workers listed with their addresses", || {
        for c in &mut fleet.0 {
            let exited = c.try_wait().unwrap();
            assert!(exited.is_none(), "a worker exited at start: {exited:?}");
        }
        listed = status_json(&db.url)["workers"].clone();
        let ok = listed
            .as_array()
            .is_some_and(|w| w.len() == 3 && w.iter().all(|w| w["http_addr"].is_string()));
        async move { ok }
    })
    .await;
    let mut addrs: Vec<String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["http_addr"].as_str().unwrap().to_owned())
        .collect();
    for addr in &addrs {
        let text = reqwest::get(format!("http://{addr}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(text.trim_end().ends_with("# EOF"), "{addr}: {text}");
        let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
        assert!(addr.starts_with("127.0.0.1:"), "{addr}");
        assert!(port != 0, "{addr}");
    }
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 3, "one address each: {addrs:?}");
    let table = courier_on(&db.url).arg("status").output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    for addr in &addrs {
        assert!(table.contains(&format!("http://{addr}/")), "{table}");
    }

    // They deliver.
    for rule in ["a", "b", "c"] {
        courier::enqueue::enqueue_many(&db.pool, rule, burst(rule, 20))
            .await
            .unwrap();
    }
    eventually("every delivery delivered", || async {
        delivered(&db.pool).await == 60
    })
    .await;
    assert_eq!(target.counters().requests, 60);

    for c in &mut fleet.0 {
        let status = stop(c);
        assert!(status.success(), "{status}");
    }
    fleet.0.clear();
    let mut logged = String::new();
    for log in &logs {
        logged += &std::fs::read_to_string(log.with_extension("err")).unwrap();
        let _ = std::fs::remove_file(log);
        let _ = std::fs::remove_file(log.with_extension("err"));
    }
    for addr in &addrs {
        assert!(
            logged.contains("serving /metrics and the dashboard") && logged.contains(addr),
            "each address is logged: {addr}\n{logged}"
        );
    }
    assert_eq!(
        left_behind(&db.pool).await.0,
        0,
        "clean stops remove their rows"
    );
    assert!(
        status_json(&db.url)["workers"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

/// A start that fails leaves nothing behind: no worker row that others take for alive, no
/// apalis registration, no lease, no locked job; whether it failed on a bad setting, on an
/// address the operator set that another process holds, on the database not answering a
/// statement in time, or on a database that does not answer at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_leaves_nothing_behind() {
    let (db, _target) = shop(&["customers"], 10, 1).await;
    courier::enqueue::enqueue_many(&db.pool, "customers", burst("c", 5))
        .await
        .unwrap();
    let run = |envs: &[(&str, &str)]| {
        let mut command = courier();
        command.arg("worker").env("DATABASE_URL", &db.url);
        for (k, v) in envs {
            command.env(k, v);
        }
        let started = Instant::now();
        let out = command.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            started.elapsed(),
        )
    };

    // A bad setting.
    let (code, err, _) = run(&[("COURIER_WORKER_CONCURRENCY", "lots")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("COURIER_WORKER_CONCURRENCY"), "{err}");
    assert_eq!(left_behind(&db.pool).await, (0, 0, 0, 0), "bad setting");

    // An address the operator set, held by another process: today's error, nothing left.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().to_string();
    let (code, err, _) = run(&[("COURIER_HTTP_ADDR", &busy)]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "cannot serve metrics and the dashboard on {busy} (COURIER_HTTP_ADDR"
        )) && err.contains("in use"),
        "{err}"
    );
    assert_eq!(left_behind(&db.pool).await, (0, 0, 0, 0), "busy address");
    drop(taken);

    // The database does not answer the start's statements in time (a table it writes at
    // start is locked): the start fails once the statement times out.
    let mut locker = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE circuits IN EXCLUSIVE MODE")
        .execute(&mut *locker)
        .await
        .unwrap();
    let (code, err, _) = run(&[("COURIER_DB_STATEMENT_TIMEOUT_SECONDS", "1")]);
    locker.rollback().await.unwrap();
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("statement timeout"), "{err}");
    assert_eq!(
        left_behind(&db.pool).await,
        (0, 0, 0, 0),
        "statement timeout"
    );

    // A database that accepts the connection and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!(
        "postgres://postgres@{}/courier?sslmode=disable",
        silent.local_addr().unwrap()
    );
    let mut command = courier();
    command
        .arg("worker")
        .env("DATABASE_URL", &silent_url)
        .env("COURIER_DB_CONNECT_TIMEOUT_SECONDS", "1");
    let started = Instant::now();
    let out = command.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "gave up after {:?}: {err}",
        started.elapsed()
    );
    drop(silent);
    assert_eq!(left_behind(&db.pool).await, (0, 0, 0, 0), "silent database");

    // And the next worker starts at once and delivers, nothing to wait out.
    let log = log_path("after");
    let mut fleet = Fleet(vec![worker(&db.url, &log).spawn().unwrap()]);
    within(Duration::from_secs(10), "the backlog delivered", || async {
        delivered(&db.pool).await == 5
    })
    .await;
    assert!(stop(&mut fleet.0[0]).success());
    fleet.0.clear();
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(log.with_extension("err"));
}

/// The work of a holder killed with SIGKILL resumes within 10 s in a process started just
/// before the kill, far younger than the liveness window (15 s): the killed process's
/// session being gone is evidence enough. Before, the young process judged nobody until it
/// had been up for a whole window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_work_resumes_within_seconds_in_a_process_younger_than_the_window() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    // 5 calls/s: the backlog lasts a minute.
    sqlx::query("UPDATE connections SET requests_per_minute = 300")
        .execute(&db.pool)
        .await
        .unwrap();
    courier::enqueue::enqueue_many(&db.pool, "customers", burst("c", 300))
        .await
        .unwrap();
    let (log_a, log_b) = (log_path("a"), log_path("b"));
    let mut fleet = Fleet(vec![worker(&db.url, &log_a).spawn().unwrap()]);
    let holder = format!("courier-%-{}-%", fleet.0[0].id());
    eventually("the first worker holds the rule and calls", || async {
        let held: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM rules WHERE lease_owner LIKE $1)")
                .bind(&holder)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        held && target.counters().requests > 0
    })
    .await;

    fleet.0.push(worker(&db.url, &log_b).spawn().unwrap());
    let young_started = Instant::now();
    let young = format!("courier-%-{}-%", fleet.0[1].id());
    eventually("the second worker beats and names its session", || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM workers WHERE name LIKE $1
                            AND session_role IS NOT NULL)",
        )
        .bind(&young)
        .fetch_one(&db.pool)
        .await
        .unwrap()
    })
    .await;

    // Killed while it runs the rule's chain job and holds its lease (the young one cannot
    // take the run on its own: it waits for the job to be put back).
    eventually("the first worker runs the rule's job", || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM rules WHERE lease_owner LIKE $1)
                AND EXISTS (SELECT 1 FROM apalis.jobs WHERE status = 'Running' AND lock_by LIKE $1)",
        )
        .bind(&holder)
        .fetch_one(&db.pool)
        .await
        .unwrap()
    })
    .await;
    fleet.0[0].kill().unwrap(); // SIGKILL
    fleet.0[0].wait().unwrap();
    let killed = Instant::now();
    let calls_at_kill = target.counters().requests;
    // Only the rule's lease holder calls, and the killed one calls no more.
    within(
        Duration::from_secs(10),
        "the young worker resumes the killed one's run",
        || async { target.counters().requests > calls_at_kill },
    )
    .await;
    let resumed = Instant::now();
    println!(
        "resumed {:?} after the kill, the young worker {:?} old",
        resumed - killed,
        resumed - young_started
    );
    assert!(
        resumed - young_started < Duration::from_secs(15),
        "the resuming process was younger than the window: {:?}",
        resumed - young_started
    );
    let mut b = fleet.0.remove(1);
    fleet.0.clear();
    assert!(stop(&mut b).success());
    for log in [log_a, log_b] {
        let _ = std::fs::remove_file(&log);
        let _ = std::fs::remove_file(log.with_extension("err"));
    }
}
