//! Gaps in liveness by process found by the chaos suite (`courier bench chaos`), as
//! engine-level tests. They are ignored until the engine closes them; run them with
//! `cargo test -p courier --test rescue -- --ignored`.

mod common;

use chrono::Duration as Span;
use common::*;
use courier::{enqueue, maintenance::dispatcher::Dispatcher, maintenance::rescuer::Rescuer};
use courier_target::Target;

/// apalis marks the jobs a worker fetched `Queued` (locked by the worker's name) before it
/// starts them. When apalis' Monitor restarts that worker after a poll error (a database
/// outage longer than the pool's acquire timeout, a restart that breaks its connection),
/// it drops the worker's future with every job it held; the restarted worker keeps the
/// same name and never fetches its own `Queued` jobs again, and the process keeps beating.
/// The rescuer gives a new job only to runs whose job is `Done`, `Killed`, `Failed` or
/// `Running` (src/maintenance/rescuer.rs, the `stalled` query), so such a run waits for
/// the reaper: `COURIER_CHAIN_STALE_AFTER_SECONDS` (600 s).
#[tokio::test]
async fn a_run_whose_job_a_live_process_dropped_before_starting_it_resumes() {
    let db = TestDb::new().await;
    let target = Target::start(0).await.unwrap();
    setup(&db.pool, &target, &["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    Dispatcher::new(&engine).run_once().await.unwrap();
    let job = take_jobs(&engine).await.remove(0);

    // A live process fetched it, then lost it to a worker restart; 16 s later it still
    // beats, the job still reads Queued under its name, and the run has not moved.
    engine.clock.advance(Span::seconds(16));
    let live = "courier-live-1";
    sqlx::query("INSERT INTO workers (name, started_at, heartbeat_at) VALUES ($1, $2, $2)")
        .bind(live)
        .bind(engine.clock.now())
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO apalis.workers (id, worker_type, storage_name) VALUES ($1, 'courier.chain', 'pg')",
    )
    .bind(live)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE apalis.jobs SET status = 'Queued', done_at = NULL, lock_by = $2, lock_at = now()
         WHERE id = $1",
    )
    .bind(&job.id)
    .bind(live)
    .execute(&db.pool)
    .await
    .unwrap();

    let rescued = Rescuer::new(&engine).run_once().await.unwrap();
    assert_eq!(
        rescued.resumed,
        vec![job.job.run_id],
        "the run's heartbeat lapsed 16 s ago and its job will never start"
    );
}
