//! Gaps in liveness by process found by the chaos suite (`courier-bench chaos`) and by
//! `courier-bench cold-start`, as engine-level tests.

use std::str::FromStr;

use crate::common::*;
use chrono::Duration as Span;
use courier::{dispatcher::Dispatcher, enqueue, maintenance::rescuer::Rescuer};
use courier_target::Target;
use sqlx::{Connection, PgPool};

/// A test database with one rule, three pending deliveries, their run started and its
/// first chain job taken off the queue (as a worker's fetch would).
async fn one_run_with_its_job() -> (TestDb, Target, std::sync::Arc<courier::engine::Engine>, Job) {
    let db = TestDb::new().await;
    let target = Target::start(0).await.unwrap();
    setup(&db.pool, &target, &["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    Dispatcher::new(&engine).run_once().await.unwrap();
    let job = take_jobs(&engine).await.remove(0);
    (db, target, engine, job)
}

/// Process `worker` registered with apalis and holds chain job `job` in `status`
/// (`Queued`: fetched, not started; `Running`).
async fn held_by(pool: &PgPool, worker: &str, job: &str, status: &str) {
    sqlx::query(
        "INSERT INTO apalis.workers (id, worker_type, storage_name) VALUES ($1, 'courier.chain', 'pg')
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(worker)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE apalis.jobs SET status = $3, done_at = NULL, lock_by = $2, lock_at = now()
         WHERE id = $1",
    )
    .bind(job)
    .bind(worker)
    .bind(status)
    .execute(pool)
    .await
    .unwrap();
}

/// apalis marks the jobs a worker fetched `Queued` (locked by the worker's name) before it
/// starts them. When apalis' Monitor restarts that worker after a poll error (a database
/// outage longer than the pool's acquire timeout, a restart that breaks its connection),
/// it drops the worker's future with every job it held; the restarted worker keeps the
/// same name and never fetches its own `Queued` jobs again, and the process keeps beating.
/// The restarted worker puts its own jobs back; should that fail, the rescuer gives the run
/// a new job once its job has sat `Queued` for four windows (not sooner: under load a
/// fetched job may wait that long for a free slot).
#[tokio::test]
async fn a_run_whose_job_a_live_process_dropped_before_starting_it_resumes() {
    let (db, _target, engine, job) = one_run_with_its_job().await;

    // A live process fetched it, then lost it to a worker restart that could not put it
    // back; a minute later it still beats, the job still reads Queued under its name, and
    // the run has not moved.
    engine.clock.advance(Span::seconds(16));
    let live = "courier-live-1";
    sqlx::query("INSERT INTO workers (name, started_at, heartbeat_at) VALUES ($1, $2, $2)")
        .bind(live)
        .bind(engine.clock.now())
        .execute(&db.pool)
        .await
        .unwrap();
    held_by(&db.pool, live, &job.id, "Queued").await;

    // 16 s is not enough: under load a fetched job may wait for a free slot that long.
    let rescued = Rescuer::new(&engine).run_once().await.unwrap();
    assert!(rescued.resumed.is_empty(), "{rescued:?}");
    engine.clock.advance(Span::seconds(50));
    sqlx::query("UPDATE workers SET heartbeat_at = $2 WHERE name = $1")
        .bind(live)
        .bind(engine.clock.now())
        .execute(&db.pool)
        .await
        .unwrap();
    let rescued = Rescuer::new(&engine).run_once().await.unwrap();
    assert_eq!(
        rescued.resumed,
        vec![job.job.run_id],
        "fetched over a minute ago by a live process and never started"
    );
}

/// A process stopping cleanly (a deploy) while it holds a chain job it fetched but did not
/// finish puts the job back under the same id and frees its lease, so the next process
/// resumes the run at once instead of after another process's rescuer window (seen in
/// `courier-bench cold-start`: a worker stopped during a retry wait left the run idle for
/// 15 s).
#[tokio::test]
async fn a_cleanly_stopping_process_puts_back_what_it_holds() {
    let (db, _target, engine, job) = one_run_with_its_job().await;
    // This process registered with apalis and fetched the job.
    held_by(&db.pool, &engine.worker_name, &job.id, "Queued").await;
    sqlx::query(
        "UPDATE rules SET lease_owner = $1 || '/run', lease_until = now() + interval '1 hour'",
    )
    .bind(&engine.worker_name)
    .execute(&db.pool)
    .await
    .unwrap();
    assert!(take_jobs(&engine).await.is_empty(), "held by this process");

    let released = Rescuer::new(&engine).release_own().await.unwrap();
    assert_eq!(released, vec![job.id.clone()]);
    let leased: i64 =
        sqlx::query_scalar("SELECT count(*) FROM rules WHERE lease_owner IS NOT NULL")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(leased, 0, "the lease is free");
    let again = take_jobs(&engine).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, job.id, "the same job, so the same run resumes");
    assert!(
        Rescuer::new(&engine)
            .release_own()
            .await
            .unwrap()
            .is_empty(),
        "a job no longer held is not touched"
    );
}

/// A process killed with -9 loses its named session at once: two beats later another
/// process takes its jobs over, without waiting the whole beat window. A process whose
/// session is still there, or that named none, keeps its jobs until its beat lapses.
#[tokio::test]
async fn a_process_whose_session_is_gone_is_dead_two_beats_after_its_last() {
    let db = TestDb::new().await;
    let target = Target::start(0).await.unwrap();
    setup(&db.pool, &target, &["a", "b", "c"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    for rule in ["a", "b", "c"] {
        enqueue::enqueue_many(&db.pool, rule, burst(rule, 2))
            .await
            .unwrap();
    }
    Dispatcher::new(&engine).run_once().await.unwrap();
    let jobs: Vec<String> = sqlx::query_scalar("SELECT id FROM apalis.jobs ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 3);
    // Three processes, each holding one job, each last beating 7 s ago (the window is
    // 15 s; two beats are 6 s): one killed (its named session is gone), one alive (its
    // session is open), one that never named a session.
    let beat = engine.clock.now() - Span::seconds(7);
    let alive_session = sqlx::postgres::PgConnectOptions::from_str(&db.url)
        .unwrap()
        .application_name("courier-alive");
    let mut alive = sqlx::PgConnection::connect_with(&alive_session)
        .await
        .unwrap();
    for (name, job, named) in [
        ("courier-killed", &jobs[0], true),
        ("courier-alive", &jobs[1], true),
        ("courier-unnamed", &jobs[2], false),
    ] {
        sqlx::query(
            "INSERT INTO workers (name, started_at, heartbeat_at, session_role)
             VALUES ($1, $2, $2, CASE WHEN $3 THEN current_user END)",
        )
        .bind(name)
        .bind(beat)
        .bind(named)
        .execute(&db.pool)
        .await
        .unwrap();
        held_by(&db.pool, name, job, "Running").await;
    }

    let rescued = Rescuer::new(&engine).run_once().await.unwrap();
    assert_eq!(
        rescued.requeued,
        vec![jobs[0].clone()],
        "only the killed one's"
    );

    // The live one's session closes: it is dead too, two beats after its last beat.
    sqlx::query("SELECT 1").execute(&mut alive).await.unwrap();
    alive.close().await.unwrap();
    let mut rescued = Default::default();
    for _ in 0..50 {
        rescued = Rescuer::new(&engine).run_once().await.unwrap();
        if !rescued.requeued.is_empty() {
            break;
        }
        // The server drops a closed session from pg_stat_activity a moment later.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(rescued.requeued, vec![jobs[1].clone()]);
    // The one that never named a session waits for the whole window.
    engine.clock.advance(Span::seconds(9));
    let rescued = Rescuer::new(&engine).run_once().await.unwrap();
    assert_eq!(rescued.requeued, vec![jobs[2].clone()]);
}

/// A job that loaded its run just before the rescuer gave the run a new job (the run had
/// looked stalled) must not keep the rule's lease: taking the lease and beating on the run
/// are one transaction, so finding the run carried by another job leaves the lease free,
/// and the new job is not kept waiting until it expires (the staleness window, ten
/// minutes).
#[tokio::test]
async fn a_job_whose_run_moved_on_leaves_the_lease_free() {
    let (db, target, engine, job) = one_run_with_its_job().await;
    let ctx = courier::chain::context::load(&engine, job.job.run_id, engine.clock.now())
        .await
        .unwrap()
        .unwrap();
    // Meanwhile the run is given to another job.
    sqlx::query("UPDATE runs SET job_id = 'another-job'")
        .execute(&db.pool)
        .await
        .unwrap();
    courier::chain::execute(&engine, &ctx, &job.id)
        .await
        .unwrap();
    let leased: i64 =
        sqlx::query_scalar("SELECT count(*) FROM rules WHERE lease_owner IS NOT NULL")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(leased, 0, "the lease is free for the run's job");
    assert_eq!(target.counters().requests, 0, "nothing called");
}

/// How far a process may judge others follows its own view of the database (issue #28).
/// Just started, it judges nobody; once it has reached the database for two beats and
/// ever since it started, it takes for dead only a process whose named session is gone
/// (killed): not one whose beat alone has lapsed, as every beat looks lapsed to a process
/// that was itself cut off; after a whole window, both. A process that was cut off from the
/// database since it started judges nobody again until it has reached it for a window.
#[tokio::test]
async fn a_young_process_takes_only_the_killed_for_dead_and_one_cut_off_nobody() {
    use courier::maintenance::rescuer::Judgement;

    let db = TestDb::new().await;
    let target = Target::start(0).await.unwrap();
    setup(&db.pool, &target, &["a", "b", "c"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    for rule in ["a", "b", "c"] {
        enqueue::enqueue_many(&db.pool, rule, burst(rule, 2))
            .await
            .unwrap();
    }
    Dispatcher::new(&engine).run_once().await.unwrap();
    let jobs: Vec<String> = sqlx::query_scalar("SELECT id FROM apalis.jobs ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 3);
    let rescuer = Rescuer::new(&engine);
    assert_eq!(rescuer.judgement(), None, "just started: judges nobody");

    // Three others, each holding a job: one killed 7 s after its last beat (its named
    // session gone), one whose beat lapsed 20 s ago while its session is open (it cannot
    // write, or this process's view of the beats is behind), one that named no session
    // and last beat 20 s ago.
    let now = engine.clock.now();
    let open = sqlx::postgres::PgConnectOptions::from_str(&db.url)
        .unwrap()
        .application_name("courier-lapsed");
    let lapsed_session = sqlx::PgConnection::connect_with(&open).await.unwrap();
    for (name, job, beat, named) in [
        ("courier-killed", &jobs[0], now - Span::seconds(7), true),
        ("courier-lapsed", &jobs[1], now - Span::seconds(20), true),
        ("courier-unnamed", &jobs[2], now - Span::seconds(20), false),
    ] {
        sqlx::query(
            "INSERT INTO workers (name, started_at, heartbeat_at, session_role)
             VALUES ($1, $2, $2, CASE WHEN $3 THEN current_user END)",
        )
        .bind(name)
        .bind(beat)
        .bind(named)
        .execute(&db.pool)
        .await
        .unwrap();
        held_by(&db.pool, name, job, "Running").await;
    }
    // A lease the killed one held.
    sqlx::query(
        "UPDATE rules SET lease_owner = 'courier-killed/1', lease_until = now() + interval '1 hour'
         WHERE name = 'a'",
    )
    .execute(&db.pool)
    .await
    .unwrap();

    // Two beats (6 s of the 15 s window) after its start, never cut off.
    engine.clock.advance(Span::seconds(5));
    assert_eq!(rescuer.judgement(), None);
    engine.clock.advance(Span::seconds(1));
    assert_eq!(rescuer.judgement(), Some(Judgement::SessionGone));
    let rescued = rescuer.run_as(Judgement::SessionGone).await.unwrap();
    assert_eq!(
        rescued.requeued,
        vec![jobs[0].clone()],
        "only the killed one's"
    );
    assert!(rescued.resumed.is_empty());
    let leased: i64 =
        sqlx::query_scalar("SELECT count(*) FROM rules WHERE lease_owner IS NOT NULL")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(leased, 0, "the killed one's lease is free");
    assert!(
        rescuer
            .run_as(Judgement::SessionGone)
            .await
            .unwrap()
            .requeued
            .is_empty(),
        "a lapsed beat alone is no proof for a young process"
    );

    // Cut off from the database for a moment: it judges nobody, not even by sessions,
    // until it has reached the database for a whole window again.
    engine.health.failed(&sqlx::Error::PoolTimedOut);
    assert_eq!(rescuer.judgement(), None);
    engine.health.ok();
    engine.clock.advance(Span::seconds(14));
    assert_eq!(
        rescuer.judgement(),
        None,
        "cut off once: sessions are not enough"
    );
    engine.clock.advance(Span::seconds(1));
    assert_eq!(rescuer.judgement(), Some(Judgement::Full));
    let mut requeued = rescuer.run_as(Judgement::Full).await.unwrap().requeued;
    requeued.sort();
    assert_eq!(requeued, vec![jobs[1].clone(), jobs[2].clone()]);
    lapsed_session.close().await.unwrap();
}

#[tokio::test]
async fn the_pruner_forgets_processes_dead_for_an_hour_and_keeps_the_living() {
    let db = TestDb::new().await;
    let engine = engine(&db.pool, settings(&db.url));
    sqlx::query(
        "INSERT INTO workers (name, started_at, heartbeat_at)
         VALUES ('courier-gone', now() - interval '3 hours', now() - interval '2 hours'),
                ('courier-recent', now() - interval '3 hours', now() - interval '5 minutes')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    courier::maintenance::pruner::Pruner::new(&engine)
        .run_once()
        .await
        .unwrap();
    let mut names: Vec<String> = sqlx::query_scalar("SELECT name FROM workers ORDER BY name")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    names.retain(|n| n != &engine.worker_name);
    assert_eq!(names, ["courier-recent"]);
}
