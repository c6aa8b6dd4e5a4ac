//! The short form of `courier-bench chaos`: real `courier worker` processes on a private
//! throwaway PostgreSQL cluster, one SIGKILL of the busy worker mid-burst and one restart
//! of the cluster mid-burst, with the engine's default liveness settings. It asserts what
//! issue #11 promises: nothing lost, delivery resumes within 30 s of the kill and within
//! 10 s of the database answering again (see the test for the one exception it
//! tolerates, a known engine bug), duplicates no more than the calls in flight at the
//! fault plus a second of calls.
//!
//! To see it fail, give the workers a liveness window longer than the promise:
//! `COURIER_WORKER_DEAD_AFTER_SECONDS=60 cargo test -p courier-bench --test it chaos::`.

use std::time::{Duration, Instant};

use courier_bench::chaos::{self, ChaosOptions, FaultKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_and_a_database_restart_lose_nothing_and_cost_seconds() {
    let started = Instant::now();
    let options = ChaosOptions {
        records: 100,
        rate: 20,
        workers: 2,
        kills: 1,
        rolling: 0,
        restart: true,
        outage: None,
        poison: false,
        poison_apalis: false,
        latency: (Duration::from_millis(20), Duration::from_millis(80)),
        seed: 11,
        drain_limit: Duration::from_secs(60),
        keep_logs: false,
        skews: Vec::new(),
        ..ChaosOptions::bench(courier_bench::courier_exe().unwrap())
    };
    let (report, out) = chaos::run(options).await.unwrap();
    let table = report.render();
    println!("{table}");
    println!("took {:.1} s", started.elapsed().as_secs_f64());

    assert_eq!(out.lost, 0, "every record arrives\n{table}");
    assert!(out.enqueued >= 150, "{table}");
    assert_eq!(out.unexplained_duplicates, 0, "{table}");
    assert_eq!(out.workers_died, 0, "no worker dies of a restart\n{table}");
    assert_eq!(out.runs_left_active, 0, "no run is left running\n{table}");

    let kill = out.of(FaultKind::Kill).next().expect("one kill");
    assert!(
        kill.victim_busy && !kill.backlog_rules.is_empty(),
        "the kill must hit a worker with work, or it proves nothing\n{table}"
    );
    let resumed = kill.resumed_after.expect("delivery resumes after the kill");
    assert!(
        resumed <= 30.0,
        "resumed {resumed:.1} s after the kill\n{table}"
    );
    assert!(
        kill.duplicates <= kill.bound,
        "{} duplicates after the kill, bound {}\n{table}",
        kill.duplicates,
        kill.bound
    );

    let restart = out.of(FaultKind::DbRestart).next().expect("one restart");
    let resumed = restart
        .resumed_after
        .expect("delivery resumes after the restart");
    // Issue #11's goal: 10 s. The chain worker's backend retries through the restart, so
    // apalis never restarts the worker (which would drop the jobs it holds).
    assert_eq!(restart.worker_restarts, 0, "chain worker restarts\n{table}");
    let bound = 10.0;
    assert!(
        resumed <= bound,
        "resumed {resumed:.1} s after the database answered ({} chain worker \
         restarts)\n{table}",
        restart.worker_restarts
    );
    assert!(
        restart.duplicates <= restart.bound,
        "{} duplicates after the restart, bound {}\n{table}",
        restart.duplicates,
        restart.bound
    );
}

/// Issue #11 goal 2 for an outage longer than the pool's 30 s acquire timeout (about 80 s).
/// apalis' own poller would fail with `PoolTimedOut` and its Monitor would restart the
/// chain worker, dropping the jobs it held (apalis-core 1.0.0, `monitor/mod.rs`); courier's
/// backend retries through the outage instead, so delivery resumes as soon as the
/// database answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_database_outage_costs_seconds_once_it_answers() {
    let options = ChaosOptions {
        records: 100,
        rate: 10,
        workers: 2,
        kills: 0,
        rolling: 0,
        restart: false,
        // Longer than the pool's acquire timeout, so every poller gives up during it.
        outage: Some(Duration::from_secs(40)),
        poison: false,
        poison_apalis: false,
        latency: (Duration::from_millis(20), Duration::from_millis(80)),
        seed: 11,
        drain_limit: Duration::from_secs(120),
        keep_logs: false,
        skews: Vec::new(),
        ..ChaosOptions::bench(courier_bench::courier_exe().unwrap())
    };
    let (report, out) = chaos::run(options).await.unwrap();
    let table = report.render();
    println!("{table}");
    assert_eq!(out.lost, 0, "{table}");
    assert_eq!(out.workers_died, 0, "{table}");
    let outage = out.of(FaultKind::DbOutage).next().expect("one outage");
    let resumed = outage.resumed_after.expect("delivery resumes");
    assert!(
        resumed <= 10.0,
        "resumed {resumed:.1} s after the database answered\n{table}"
    );
    assert!(
        outage.duplicates <= outage.bound,
        "{} duplicates after the outage, bound {}\n{table}",
        outage.duplicates,
        outage.bound
    );
}

/// Issue #28: the fleet rolls (a SIGKILL every 5 s, of a lease holder, then of the oldest
/// process, a replacement started each time), so no process lives a whole liveness window
/// (15 s). The work of each killed holder still resumes within seconds: a killed process's
/// session being gone is evidence enough for a process younger than the window. Before,
/// delivery stopped until a window after the last kill (57 s). The goal, 10 s after each
/// kill, is `courier-bench chaos`'s figure on a quiet machine (BENCHMARKS.md); here, with
/// the other chaos tests' clusters and workers sharing two cores, the bound is twice that,
/// still well short of a whole window after the last kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_fleet_resumes_each_killed_holders_work_within_seconds() {
    let options = ChaosOptions {
        records: 240,
        rate: 10,
        workers: 2,
        kills: 0,
        rolling: 4,
        rolling_every: Duration::from_secs(5),
        restart: false,
        outage: None,
        poison: false,
        poison_apalis: false,
        latency: (Duration::from_millis(20), Duration::from_millis(80)),
        seed: 28,
        drain_limit: Duration::from_secs(120),
        keep_logs: false,
        skews: Vec::new(),
        ..ChaosOptions::bench(courier_bench::courier_exe().unwrap())
    };
    let (report, out) = chaos::run(options).await.unwrap();
    let table = report.render();
    println!("{table}");
    assert_eq!(out.lost, 0, "{table}");
    assert_eq!(out.workers_died, 0, "{table}");
    let rolls: Vec<_> = out.of(FaultKind::Roll).collect();
    assert_eq!(rolls.len(), 4, "{table}");
    assert!(
        rolls.iter().any(|f| !f.victim_rules.is_empty()),
        "some kill must hit a lease holder, or it proves nothing\n{table}"
    );
    for f in &rolls {
        let resumed = f.resumed_after.expect("delivery resumes after every kill");
        assert!(
            resumed <= 20.0,
            "resumed {resumed:.1} s after a kill\n{table}"
        );
    }
    let stall = out.rolling_stall.expect("the rolling phase ran");
    assert!(stall <= 20.0, "delivery stalled {stall:.1} s\n{table}");
}

/// One host's wall clock off by a second either way, then by an hour either way: real
/// worker processes under libfaketime (installed by `scripts/install-faketime`) keep the
/// database's time, so every burst drains as with one clock, with no duplicate and no
/// worker taken for dead, and each skewed worker reports its offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_clock_is_off_changes_nothing() {
    let skews = ["+1", "-1", "+1h", "-1h"];
    let options = ChaosOptions {
        records: 120,
        rate: 20,
        workers: 2,
        kills: 0,
        rolling: 0,
        restart: false,
        outage: None,
        poison: false,
        poison_apalis: false,
        latency: (Duration::from_millis(20), Duration::from_millis(80)),
        seed: 12,
        drain_limit: Duration::from_secs(60),
        keep_logs: false,
        skews: skews.iter().map(|s| (*s).to_owned()).collect(),
        ..ChaosOptions::bench(courier_bench::courier_exe().unwrap())
    };
    let (report, out) = chaos::run(options).await.unwrap();
    let table = report.render();
    println!("{table}");
    assert_eq!(out.lost, 0, "every record arrives\n{table}");
    assert_eq!(out.duplicates, 0, "no record sent twice\n{table}");
    assert_eq!(out.workers_died, 0, "{table}");
    assert_eq!(out.skews.len(), skews.len(), "{table}");
    for (k, want) in out.skews.iter().zip([1.0, -1.0, 3600.0, -3600.0]) {
        let shown = k
            .measured_offset
            .expect("the skewed worker's offset is recorded");
        assert!(
            (shown - want).abs() < 0.5,
            "skew {}: offset shown {shown:+.3} s\n{table}",
            k.skew
        );
        // 60 records at 20/s: 3 s ideal; a stall or a wait on a wrong clock takes longer.
        assert!(
            k.drain_ratio < 2.0,
            "skew {}: drained in {:.2} x ideal\n{table}",
            k.skew,
            k.drain_ratio
        );
    }
}
