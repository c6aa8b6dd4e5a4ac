//! `courier-bench chaos`: liveness under faults, with real processes. On a private
//! throwaway PostgreSQL cluster (never the shared server: this scenario restarts it and
//! takes it down), real `courier worker` child processes deliver bursts into the local
//! User.com target while the harness
//!
//! 1. kills a random busy worker with SIGKILL, again and again during a burst, starting
//!    a replacement each time;
//! 1. rolls the fleet: every few seconds, whether the last kill's work has resumed or not,
//!    SIGKILLs a lease holder, then the oldest process, in turn, starting a replacement
//!    each time (a bad rollout, a crash loop), so no process lives a whole liveness window;
//! 2. restarts the cluster mid-burst (`pg_ctl restart`), then takes it down for a while
//!    mid-burst (`pg_ctl stop`, wait, `pg_ctl start`);
//! 3. writes poison rows by plain SQL (timestamps past chrono's range, a mistyped rule
//!    path, a connection whose key variable is unset, an apalis job whose id is not a
//!    ULID) while a healthy burst is delivered;
//! 4. skews one host's clock: for each skew in turn, one worker is replaced by one whose
//!    wall clock libfaketime shifts (monotonic time untouched), and a burst is drained
//!    by it and the others; the fleet keeps the database's time, so the burst must
//!    drain as with one clock, with no duplicate and nobody taken for dead.
//!
//! The target logs every accepted write with the moment its request arrived; from that
//! log come the lost records, the duplicate sends (the same record accepted twice, each
//! charged to the fault before it), the time from each fault to the moment every rule
//! that had a backlog was called again, and the longest pause of a rule with a backlog.
//! The test suite runs a short form (`crates/courier-bench/tests/it/chaos.rs`).

use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use courier_target::{AcceptedWrite, Faults, RetryAfterMode, Target, TargetConfig, Window};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;
use serde_json::json;
use sqlx::{PgPool, postgres::PgPoolOptions};

use super::{Mark, Report, SAMPLE_EVERY, Sample};
use courier::{
    catalog::{self, NewConnection, NewRule},
    chain::lease,
    clock::Clock,
    config::DEFAULT_WORKER_DEAD_AFTER_SECS,
    db,
    enqueue::{self, NewDelivery},
    queue, runs, workers,
};
use courier_cli::cluster::{Cluster, server_binaries};

/// The environment variable the healthy connection reads its (fake) key from.
const KEY_VAR: &str = "COURIER_CHAOS_USERCOM_KEY";
/// The variable the poison connection names; removed from every worker's environment.
const UNSET_KEY_VAR: &str = "COURIER_CHAOS_UNSET_KEY";
/// The target workspace's token.
const TOKEN: &str = "chaos-token";
/// The target workspace.
const WORKSPACE: &str = "chaos";
/// The rules whose every record must arrive: two, so a kill may hit either holder.
pub const HEALTHY_RULES: [&str; 2] = ["customers", "orders"];
/// The database the scenario creates on its private cluster.
const DATABASE: &str = "courier_chaos";
/// How long the apalis row is watched before the harness removes it.
const APALIS_WATCH: Duration = Duration::from_secs(20);
/// The longest the harness waits for the rules a kill stopped to be called again before
/// it goes on with the next kill (the fault's record then says how long it really took).
const RECOVERY_WAIT: Duration = Duration::from_secs(180);

/// How a chaos run is set up.
#[derive(Clone, Debug)]
pub struct ChaosOptions {
    /// The `courier` executable run as `courier worker`.
    pub worker_exe: PathBuf,
    /// Records of the kill phase's burst, split over the two healthy rules (the burst is
    /// topped up while kills remain); the database phases enqueue half as many each, the
    /// poison phase a third.
    pub records: usize,
    /// Calls per second the connection declares and the target's workspace allows
    /// (sliding window).
    pub rate: u32,
    /// Worker processes kept running.
    pub workers: usize,
    /// SIGKILLs during the kill phase (0 skips it).
    pub kills: usize,
    /// SIGKILLs during the rolling phase, one every [`ChaosOptions::rolling_every`] (0
    /// skips it).
    pub rolling: usize,
    /// The time between two kills of the rolling phase.
    pub rolling_every: Duration,
    /// Restart the cluster mid-burst.
    pub restart: bool,
    /// Take the cluster down this long mid-burst.
    pub outage: Option<Duration>,
    /// Run the poison phase.
    pub poison: bool,
    /// Run the apalis phase: a job whose id is not a ULID in apalis' table, beside a small
    /// healthy burst (removed by the harness after a while if it stops delivery).
    pub poison_apalis: bool,
    /// The poison phase lasts at least this long (failed runs are counted over it).
    pub poison_watch: Duration,
    /// The target's answer time, uniform in this range (so calls are in flight).
    pub latency: (Duration, Duration),
    /// The connection's max calls in flight.
    pub max_in_flight: i32,
    /// Seed of the victim choice.
    pub seed: u64,
    /// The longest a phase may take to drain before the run fails.
    pub drain_limit: Duration,
    /// Keep the worker logs (their directory is printed); otherwise they are removed.
    pub keep_logs: bool,
    /// The skew phase's wall-clock shifts, as libfaketime's `FAKETIME` offsets (`+1`,
    /// `-0.05`, `+1h`), one burst each (empty skips the phase).
    pub skews: Vec<String>,
}

/// The skews `courier-bench chaos` tries: none (the same phase without libfaketime, the
/// baseline), ±50 ms, ±1 s, ±20 s and ±1 h.
pub const BENCH_SKEWS: [&str; 9] = [
    NO_SKEW, "+0.05", "-0.05", "+1", "-1", "+20", "-20", "+1h", "-1h",
];

/// The skew phase's baseline: a plain worker, no libfaketime.
pub const NO_SKEW: &str = "none";

impl ChaosOptions {
    /// The benchmark's setup: 600 records at 10/s, 2 workers, 10 kills, 10 rolling kills
    /// 5 s apart, a restart, a 30 s outage and the poison rows.
    pub fn bench(worker_exe: PathBuf) -> Self {
        Self {
            worker_exe,
            records: 600,
            rate: 10,
            workers: 2,
            kills: 10,
            rolling: 10,
            rolling_every: Duration::from_secs(5),
            restart: true,
            outage: Some(Duration::from_secs(30)),
            poison: true,
            poison_apalis: true,
            poison_watch: Duration::from_secs(60),
            latency: (Duration::from_millis(50), Duration::from_millis(250)),
            max_in_flight: 8,
            seed: rand::random(),
            drain_limit: Duration::from_secs(900),
            keep_logs: true,
            skews: BENCH_SKEWS.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
}

/// Which fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL of a worker process (a replacement started at once).
    Kill,
    /// SIGKILL of a lease holder or of the oldest process while the fleet rolls (a kill
    /// every few seconds, a replacement started at once).
    Roll,
    /// `pg_ctl restart`.
    DbRestart,
    /// `pg_ctl stop`, a wait, `pg_ctl start`.
    DbOutage,
    /// A worker whose host's wall clock is off (started with libfaketime).
    Skew,
}

/// One fault and what it cost.
#[derive(Clone, Debug, Serialize)]
pub struct FaultRecord {
    /// Which fault.
    pub kind: FaultKind,
    /// Seconds since the run's first burst when it struck.
    pub at: f64,
    /// Database faults: seconds since the first burst when the database answered again.
    pub answering_at: Option<f64>,
    /// Kills: whether the victim was executing a chain job or held a rule's lease.
    pub victim_busy: bool,
    /// Kills: the rules whose lease the victim held.
    pub victim_rules: Vec<String>,
    /// Requests in progress at the target when it struck.
    pub in_flight: usize,
    /// Healthy rules with pending deliveries when it struck.
    pub backlog_rules: Vec<String>,
    /// Seconds from the fault (kills) or from the database answering again (database
    /// faults) until every rule in `backlog_rules` had a call arrive; `None`: some never
    /// did.
    pub resumed_after: Option<f64>,
    /// Seconds from the fault itself until then (equal to `resumed_after` for kills).
    pub resumed_after_fault: Option<f64>,
    /// Accepted writes of a record accepted before, arriving after this fault and before
    /// the next one.
    pub duplicates: u64,
    /// Calls in flight at the fault plus one second of calls at the declared rate.
    pub bound: u64,
    /// Database faults: how often apalis' Monitor restarted a process's chain worker
    /// after a failed poll, from the fault until the phase drained (each restart drops
    /// the chain jobs that worker held).
    pub worker_restarts: u64,
}

/// What the poison phase saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PoisonRecord {
    /// How long the poison rows sat there while observed (s).
    pub watched: f64,
    /// Runs ended `failed` over that time (every rule).
    pub failed_runs: i64,
    /// Runs started for the two unusable rules over that time.
    pub poison_runs: i64,
    /// Lines the workers logged over that time.
    pub log_lines: u64,
    /// Of them, restarts of apalis' chain worker.
    pub worker_restarts: u64,
    /// What each poison row led to (or why it was refused at the door).
    pub rows: BTreeMap<String, String>,
    /// The errors of the first failed runs.
    pub failed_reasons: Vec<String>,
}

/// What the apalis job whose id is not a ULID did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ApalisRecord {
    /// Why the insert failed, if the schema refused it.
    pub refused: Option<String>,
    /// How long it sat there, watched (s).
    pub watched: f64,
    /// Healthy records enqueued beside it.
    pub enqueued: u64,
    /// Of them, arrived at the target while it sat there.
    pub arrived_while_there: u64,
    /// Lines the workers logged meanwhile.
    pub log_lines: u64,
    /// Of them, restarts of apalis' chain worker.
    pub worker_restarts: u64,
    /// The row's state at the end of the watch.
    pub row: String,
    /// When the harness had to delete the row: seconds from then until the burst was
    /// delivered.
    pub drained_after_removal: Option<f64>,
}

/// What a chaos run measured.
#[derive(Clone, Debug, Serialize)]
pub struct ChaosOutcome {
    /// Every fault, in order.
    pub faults: Vec<FaultRecord>,
    /// Healthy records enqueued.
    pub enqueued: u64,
    /// Healthy records not `delivered` in the database, or never accepted by the target.
    pub lost: u64,
    /// Of them: not `delivered` in the database.
    pub not_delivered: u64,
    /// Of them: never accepted by the target.
    pub never_arrived: u64,
    /// Accepted writes beyond the first per record (every phase).
    pub duplicates: u64,
    /// Duplicates that arrived before any fault (there is no excuse for those).
    pub unexplained_duplicates: u64,
    /// The longest gap between two calls of one healthy rule while it had a backlog (s),
    /// and where.
    pub longest_pause: f64,
    /// Where the longest pause was: `phase/rule`.
    pub longest_pause_where: String,
    /// The rolling phase, when it ran: the longest time from its first kill until it
    /// drained that no record of it arrived (s).
    pub rolling_stall: Option<f64>,
    /// Worker processes that exited without being killed or stopped.
    pub workers_died: usize,
    /// Healthy runs still `running` or `waiting` at the end.
    pub runs_left_active: i64,
    /// The poison phase, when it ran.
    pub poison: Option<PoisonRecord>,
    /// The apalis row phase, when it ran.
    pub apalis: Option<ApalisRecord>,
    /// The skew phase: one record per skew.
    pub skews: Vec<SkewRecord>,
    /// 429s the target answered.
    pub throttled: u64,
}

impl ChaosOutcome {
    /// Faults of one kind.
    pub fn of(&self, kind: FaultKind) -> impl Iterator<Item = &FaultRecord> {
        self.faults.iter().filter(move |f| f.kind == kind)
    }
}

/// `courier-bench chaos`: the benchmark's setup, as a report.
pub async fn bench(options: ChaosOptions) -> anyhow::Result<Report> {
    Ok(run(options).await?.0)
}

/// Runs the scenario; returns the report (figures, timeline, fault marks) and the
/// structured outcome tests assert on.
pub async fn run(options: ChaosOptions) -> anyhow::Result<(Report, ChaosOutcome)> {
    anyhow::ensure!(options.workers >= 1, "chaos needs at least one worker");
    anyhow::ensure!(options.records >= 6, "chaos needs at least 6 records");
    let (cluster, url, pool) = private_database().await?;
    let machine = super::machine(&pool).await;
    let target = start_target(&options).await?;
    declare_catalog(&pool, &target, &options).await?;
    let mut workers = Workers::new(options.worker_exe.clone(), url)?;
    for _ in 0..options.workers {
        workers.spawn()?;
    }
    workers.until_beating(&pool, options.workers).await?;
    let log_dir = workers.log_dir.clone();

    let mut h = Harness::new(&options, &pool, &target, &cluster);
    let timeline = h.drive(&mut workers).await?;
    let outcome = h.outcome(&workers).await?;
    let mut report = Report::new("chaos", machine);
    report.declared_per_second = Some(options.rate as f64);
    report.timeline = timeline;
    report.marks = h.marks.clone();
    figures(&mut report, &options, &outcome, &target);
    pool.close().await;
    if options.keep_logs {
        println!("chaos: worker logs in {}", log_dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    drop(cluster);
    Ok((report, outcome))
}

/// Starts the private throwaway cluster (never the shared server: the scenario restarts
/// it and takes it down) and a migrated database on it; returns the cluster, the
/// database's URL and a small pool for the harness.
async fn private_database() -> anyhow::Result<(Arc<Cluster>, String, PgPool)> {
    let bin = server_binaries().context(
        "chaos runs on a private PostgreSQL cluster and needs the server binaries \
         (initdb, pg_ctl) under /usr/lib/postgresql/*/bin",
    )?;
    let cluster = Arc::new(tokio::task::spawn_blocking(move || Cluster::start(&bin)).await??);
    println!(
        "chaos: private cluster in {} on 127.0.0.1:{}",
        cluster.dir.display(),
        cluster.port
    );
    let url = courier_cli::database_url(&cluster.url(), DATABASE);
    db::create_database(&url).await?;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await?;
    db::migrate(&pool).await?;
    Ok((cluster, url, pool))
}

/// Starts the local User.com target: one workspace allowing the declared rate (sliding
/// window, `Retry-After` in seconds), answering after the configured latency so calls
/// are in flight when a fault strikes.
async fn start_target(options: &ChaosOptions) -> anyhow::Result<Target> {
    let target = Target::start_with(TargetConfig {
        workspaces: vec![courier_target::WorkspaceConfig::new(WORKSPACE, TOKEN)],
        rate: options.rate,
        period: Duration::from_secs(1),
        window: Window::Sliding,
        retry_after: RetryAfterMode::Seconds,
        faults: Faults {
            latency: Some(options.latency),
            ..Faults::default()
        },
        ..TargetConfig::default()
    })
    .await?;
    Ok(target)
}

/// Declares the healthy connection (at the target's rate, its key in [`KEY_VAR`]) and
/// the [`HEALTHY_RULES`] on it, through the catalog as an operator would.
async fn declare_catalog(
    pool: &PgPool,
    target: &Target,
    options: &ChaosOptions,
) -> anyhow::Result<()> {
    // The User.com preset's connection, at the declared rate in place of its limits.
    let preset = courier::presets::find("usercom").map_err(anyhow::Error::msg)?;
    let mut c = preset.connection(&serde_json::json!({"api_key_env": KEY_VAR}));
    c.remove("limits");
    let c: NewConnection = serde_json::from_value(c.into())?;
    catalog::upsert_connection(
        pool,
        &NewConnection {
            name: "shop".into(),
            base_url: target.workspace_url(WORKSPACE),
            requests_per_minute: Some(options.rate as i32 * 60),
            max_in_flight: Some(options.max_in_flight),
            timeout_ms: Some(10_000),
            ..c
        },
    )
    .await?;
    let users = preset.rule(
        Some("usercom-users"),
        &serde_json::json!({"connection": "shop"}),
    );
    let users: NewRule = serde_json::from_value(users.map_err(anyhow::Error::msg)?.into())?;
    for rule in HEALTHY_RULES {
        let rule = NewRule {
            name: rule.into(),
            ..users.clone()
        };
        catalog::upsert_rule(pool, &rule).await?;
    }
    Ok(())
}

/// The worker processes.
struct Workers {
    exe: PathBuf,
    url: String,
    log_dir: PathBuf,
    spawned: usize,
    live: Vec<std::process::Child>,
    died: usize,
}

impl Workers {
    /// No process yet; their logs go to a fresh directory under the system's temporary
    /// one (kept or removed at the end of the run).
    fn new(exe: PathBuf, url: String) -> anyhow::Result<Self> {
        let log_dir = std::env::temp_dir().join(format!(
            "courier-chaos-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&log_dir)?;
        Ok(Self {
            exe,
            url,
            log_dir,
            spawned: 0,
            live: Vec::new(),
            died: 0,
        })
    }

    /// Waits until `n` workers beat (every worker beats before it takes a job), so the
    /// first burst meets the whole fleet; fails after 60 s.
    async fn until_beating(&self, pool: &PgPool, n: usize) -> anyhow::Result<()> {
        let ready = Instant::now() + Duration::from_secs(60);
        loop {
            let beating = workers::live(pool, chrono::Utc::now(), chrono::Duration::seconds(10))
                .await?
                .len();
            if beating >= n {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < ready,
                "the workers did not beat within 60 s (their logs: {})",
                self.log_dir.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        self.spawn_with(&[])
    }

    /// Starts a worker with these extra environment variables.
    fn spawn_with(&mut self, env: &[(&str, &str)]) -> anyhow::Result<()> {
        self.spawned += 1;
        let log = File::create(self.log_dir.join(format!("worker-{:02}.log", self.spawned)))?;
        let child = Command::new(&self.exe)
            .arg("worker")
            .envs(env.iter().copied())
            .env("DATABASE_URL", &self.url)
            .env("COURIER_LOG", "warn")
            // Many workers on one host: none serves metrics (they would share a port).
            .env("COURIER_HTTP_ADDR", "")
            .env(KEY_VAR, TOKEN)
            .env_remove(UNSET_KEY_VAR)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} worker", self.exe.display()))?;
        self.live.push(child);
        Ok(())
    }

    /// libfaketime's library, installed by `scripts/install-faketime` when missing.
    fn faketime(&self) -> anyhow::Result<String> {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/install-faketime"
        );
        let out = Command::new("bash")
            .arg(script)
            .stderr(Stdio::inherit())
            .output()
            .context("running scripts/install-faketime")?;
        anyhow::ensure!(out.status.success(), "scripts/install-faketime failed");
        Ok(String::from_utf8(out.stdout)?.trim().to_owned())
    }

    /// Stops the oldest live process cleanly (SIGTERM, then waits for it).
    fn stop_oldest(&mut self) -> anyhow::Result<()> {
        self.stop_at(0)
    }

    /// Stops the newest live process cleanly.
    fn stop_newest(&mut self) -> anyhow::Result<()> {
        self.stop_at(self.live.len().saturating_sub(1))
    }

    fn stop_at(&mut self, i: usize) -> anyhow::Result<()> {
        if i >= self.live.len() {
            return Ok(());
        }
        let mut child = self.live.remove(i);
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let status = child.wait()?;
        anyhow::ensure!(status.success(), "a worker stopped with {status}");
        Ok(())
    }

    /// Forgets (and counts) processes that exited on their own.
    fn reap(&mut self) {
        let before = self.live.len();
        self.live
            .retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
        self.died += before - self.live.len();
    }

    /// SIGKILLs the process with this pid, then starts a replacement.
    fn kill_and_replace(&mut self, pid: u32) -> anyhow::Result<()> {
        if let Some(i) = self.live.iter().position(|c| c.id() == pid) {
            let mut child = self.live.remove(i);
            let killed = child.kill(); // SIGKILL
            child.wait()?;
            killed?;
        }
        self.spawn()
    }

    /// SIGTERM to every live process; waits for each (SIGKILL after 45 s).
    fn stop_all(&mut self) -> anyhow::Result<()> {
        self.reap();
        for c in &self.live {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(45);
        let mut unclean = Vec::new();
        for mut c in self.live.drain(..) {
            loop {
                match c.try_wait()? {
                    Some(status) => {
                        if !status.success() {
                            unclean.push(format!("{}: {status}", c.id()));
                        }
                        break;
                    }
                    None if Instant::now() > deadline => {
                        let _ = c.kill();
                        let _ = c.wait();
                        unclean.push(format!("{}: did not stop within 45 s", c.id()));
                        break;
                    }
                    None => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        anyhow::ensure!(
            unclean.is_empty(),
            "workers did not stop cleanly: {}",
            unclean.join(", ")
        );
        Ok(())
    }

    fn pids(&self) -> Vec<u32> {
        self.live.iter().map(|c| c.id()).collect()
    }

    /// Lines in every worker's log so far, and of them restarts of the chain worker.
    fn log_lines(&self) -> (u64, u64) {
        let mut lines = 0;
        let mut restarts = 0;
        for entry in std::fs::read_dir(&self.log_dir).into_iter().flatten() {
            let Ok(entry) = entry else { continue };
            let Ok(file) = File::open(entry.path()) else {
                continue;
            };
            for line in BufReader::new(file).lines().map_while(Result::ok) {
                lines += 1;
                if line.contains("restarting") {
                    restarts += 1;
                }
            }
        }
        (lines, restarts)
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Never leave a worker behind, whatever failed.
        for c in &mut self.live {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One burst's phase: its name (the prefix of its records' keys) and time span.
struct Phase {
    name: &'static str,
    from: Instant,
    to: Instant,
}

/// The worker a kill picked: its pid, whether it was busy, the rules whose lease it held.
struct Victim {
    pid: u32,
    busy: bool,
    rules: Vec<String>,
}

/// Healthy records enqueued, and how many of them were lost and how.
#[derive(Default)]
struct Losses {
    enqueued: u64,
    /// Not `delivered` in the database, or never accepted by the target.
    lost: u64,
    not_delivered: u64,
    never_arrived: u64,
}

/// The scenario's state while it runs.
struct Harness {
    options: ChaosOptions,
    pool: PgPool,
    target: Target,
    cluster: Arc<Cluster>,
    started: Instant,
    faults: Vec<FaultRecord>,
    /// When each fault struck and (database faults) when the database answered again.
    fault_instants: Vec<(Instant, Option<Instant>)>,
    marks: Vec<Mark>,
    /// The next record number per (phase, rule).
    next_index: HashMap<(&'static str, &'static str), usize>,
    phases: Vec<Phase>,
    rng: StdRng,
    poison: Option<PoisonRecord>,
    apalis: Option<ApalisRecord>,
    skews: Vec<SkewRecord>,
}

/// What one skew of the skew phase cost.
#[derive(Clone, Debug, Serialize)]
pub struct SkewRecord {
    /// libfaketime's offset for the skewed worker.
    pub skew: String,
    /// Records of its burst.
    pub records: usize,
    /// The burst's drain over its ideal (records / rate).
    pub drain_ratio: f64,
    /// The largest wall-clock offset a live worker reported (s).
    pub measured_offset: Option<f64>,
}

/// The parts of a healthy record's key at the target: `user:<phase>-<rule>-<n>`.
fn parse_key(key: &str) -> Option<(&str, &str)> {
    let mut parts = key.strip_prefix("user:")?.splitn(3, '-');
    let phase = parts.next()?;
    let rule = parts.next()?;
    parts.next()?;
    HEALTHY_RULES.contains(&rule).then_some((phase, rule))
}

impl Harness {
    /// The harness before its first phase: its clock starts now, no fault yet.
    fn new(options: &ChaosOptions, pool: &PgPool, target: &Target, cluster: &Arc<Cluster>) -> Self {
        Self {
            options: options.clone(),
            pool: pool.clone(),
            target: target.clone(),
            cluster: cluster.clone(),
            started: Instant::now(),
            faults: Vec::new(),
            fault_instants: Vec::new(),
            marks: Vec::new(),
            next_index: HashMap::new(),
            phases: Vec::new(),
            rng: StdRng::seed_from_u64(options.seed),
            poison: None,
            apalis: None,
            skews: Vec::new(),
        }
    }

    /// Runs every phase while the target is sampled; Ctrl-C or SIGTERM ends the run
    /// cleanly (workers stopped, the cluster removed by its owner). On failure the
    /// database's state is dumped beside the worker logs. Returns the timeline.
    async fn drive(&mut self, workers: &mut Workers) -> anyhow::Result<Vec<Sample>> {
        let log_dir = workers.log_dir.clone();
        let sampling = Arc::new(AtomicBool::new(true));
        let sampler = tokio::spawn(sample(self.target.clone(), self.started, sampling.clone()));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let ran = tokio::select! {
            ran = self.phases(workers) => ran,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
            _ = term.recv() => Err(anyhow::anyhow!("terminated")),
        };
        sampling.store(false, Ordering::SeqCst);
        let timeline = sampler.await?;
        if ran.is_err() {
            dump_state(&self.pool, &log_dir.join("state.txt")).await;
        }
        let stopped = workers.stop_all();
        ran.with_context(|| format!("worker logs kept in {}", log_dir.display()))?;
        stopped.with_context(|| format!("worker logs kept in {}", log_dir.display()))?;
        Ok(timeline)
    }

    fn secs(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.started).as_secs_f64()
    }

    async fn phases(&mut self, workers: &mut Workers) -> anyhow::Result<()> {
        if self.options.kills > 0 {
            self.kill_phase(workers).await?;
        }
        if self.options.rolling > 0 {
            self.rolling_phase(workers).await?;
        }
        let half = (self.options.records / 2).max(6);
        if self.options.restart {
            self.db_phase("restart", half, None, workers).await?;
        }
        if let Some(outage) = self.options.outage {
            self.db_phase("outage", half, Some(outage), workers).await?;
        }
        if self.options.poison {
            self.poison_phase(workers).await?;
        }
        if self.options.poison_apalis {
            self.apalis_phase(workers).await?;
        }
        for (i, skew) in self.options.skews.clone().into_iter().enumerate() {
            self.skew_phase(i, &skew, workers).await?;
        }
        Ok(())
    }

    /// Enqueues `n` records of `phase`, split over the healthy rules.
    async fn enqueue(&mut self, phase: &'static str, n: usize) -> anyhow::Result<()> {
        let k = HEALTHY_RULES.len();
        for (i, rule) in HEALTHY_RULES.into_iter().enumerate() {
            let share = n / k + usize::from(i < n % k);
            self.enqueue_rule(phase, rule, share).await?;
        }
        Ok(())
    }

    async fn enqueue_rule(
        &mut self,
        phase: &'static str,
        rule: &'static str,
        n: usize,
    ) -> anyhow::Result<()> {
        let next = self.next_index.entry((phase, rule)).or_default();
        let batch: Vec<NewDelivery> = (*next..*next + n)
            .map(|i| {
                let id = format!("{phase}-{rule}-{i}");
                NewDelivery::new(
                    id.clone(),
                    json!({"custom_id": id, "email": format!("{rule}{i}@example.com")}),
                )
            })
            .collect();
        *next += n;
        retry(|| enqueue::enqueue_many(&self.pool, rule, batch.clone())).await?;
        Ok(())
    }

    /// Distinct records of `phase` the target accepted.
    fn arrived(&self, phase: &str) -> usize {
        let log = self.target.accepted_log();
        let mut keys: Vec<&str> = log
            .iter()
            .filter(|w| parse_key(&w.key).is_some_and(|(p, _)| p == phase))
            .map(|w| w.key.as_str())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.len()
    }

    /// Pending healthy deliveries per healthy rule (poison rows left out). The harness's
    /// own measurement over the documented `deliveries` table: which rows are poison only
    /// their keys say.
    async fn pending(&self) -> anyhow::Result<BTreeMap<String, i64>> {
        let rows: Vec<(String, i64)> = retry(|| {
            sqlx::query_as(
                "SELECT r.name, count(d.id) FROM rules r
                 LEFT JOIN deliveries d ON d.rule_id = r.id AND d.status = 'pending'
                      AND d.record_key NOT LIKE 'poisonrow-%'
                 WHERE r.name = ANY($1) GROUP BY r.name",
            )
            .bind(HEALTHY_RULES.map(String::from).to_vec())
            .fetch_all(&self.pool)
        })
        .await?;
        Ok(rows.into_iter().collect())
    }

    async fn backlog(&self) -> anyhow::Result<Vec<String>> {
        Ok(self
            .pending()
            .await?
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(r, _)| r)
            .collect())
    }

    /// Waits until `phase` has `n` records arrived.
    async fn until_arrived(&self, phase: &str, n: usize) -> anyhow::Result<()> {
        let limit = Instant::now() + self.options.drain_limit;
        while self.arrived(phase) < n {
            anyhow::ensure!(
                Instant::now() < limit,
                "phase {phase}: only {} of {n} records arrived within {:?}",
                self.arrived(phase),
                self.options.drain_limit
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Waits until no healthy delivery is pending.
    async fn drain(&mut self, phase: &'static str, from: Instant) -> anyhow::Result<()> {
        let limit = Instant::now() + self.options.drain_limit;
        loop {
            let pending: i64 = self.pending().await?.values().sum();
            if pending == 0 {
                break;
            }
            anyhow::ensure!(
                Instant::now() < limit,
                "phase {phase}: {pending} healthy deliveries still pending after {:?}",
                self.options.drain_limit
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.phases.push(Phase {
            name: phase,
            from,
            to: Instant::now(),
        });
        Ok(())
    }

    /// Live busy workers: executing a chain job or holding a rule's lease.
    async fn busy(&self, pids: &[u32]) -> anyhow::Result<BTreeMap<u32, Vec<String>>> {
        let holders = retry(|| lease::holders(&self.pool)).await?;
        let running = retry(|| queue::running_on(&self.pool)).await?;
        let owners = (holders.into_iter().map(|h| (h.worker, Some(h.rule))))
            .chain(running.into_iter().map(|worker| (worker, None)));
        let mut busy: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for (owner, rule) in owners {
            // courier-<host>-<pid>-<random>
            let Some(pid) = owner.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if pids.contains(&pid) {
                let rules = busy.entry(pid).or_default();
                rules.extend(rule);
            }
        }
        Ok(busy)
    }

    fn resumed(&self, rules: &[String], since: Instant) -> Option<Instant> {
        resumed_at(&self.target.accepted_log(), rules, since)
    }

    /// Kills a busy worker `kills` times over one burst, each time once the previous
    /// kill's rules were called again, keeping a backlog in both rules meanwhile; then
    /// waits for the burst to drain.
    async fn kill_phase(&mut self, workers: &mut Workers) -> anyhow::Result<()> {
        const PHASE: &str = "kill";
        let records = self.options.records;
        let kills = self.options.kills;
        let from = Instant::now();
        self.enqueue(PHASE, records).await?;
        // The last kill's rules, and when it struck.
        let mut previous: Option<(Instant, Vec<String>)> = None;
        for i in 1..=kills {
            let threshold = i * records / (kills + 1);
            self.until_arrived(PHASE, threshold).await?;
            if let Some((at, rules)) = &previous {
                self.until_settled(rules, *at).await;
            }
            self.top_up(
                PHASE,
                (records / (kills + 1)).max(2 * self.options.rate as usize),
            )
            .await?;
            let victim = self.pick_victim(workers).await?;
            let backlog = self.backlog().await?;
            let in_flight = self.target.in_flight();
            let at = Instant::now();
            workers.kill_and_replace(victim.pid)?;
            println!(
                "chaos: kill {i}/{kills} at {:.1} s: pid {} ({}), {in_flight} calls in flight",
                self.secs(at),
                victim.pid,
                if victim.rules.is_empty() {
                    "held no lease".to_owned()
                } else {
                    format!("held {}", victim.rules.join(", "))
                }
            );
            self.marks.push(Mark {
                t: self.secs(at),
                until: None,
                label: format!("kill {i}"),
            });
            self.record(FaultKind::Kill, at, None, in_flight, backlog.clone());
            let f = self.faults.last_mut().expect("just recorded");
            f.victim_busy = victim.busy;
            f.victim_rules = victim.rules;
            previous = Some((at, backlog));
        }
        self.drain(PHASE, from).await
    }

    /// Waits until the rules a kill at `at` stopped have all been called again, and 2 s
    /// more, so the next kill's cost is its own; a rule that never resumes is waited for
    /// [`RECOVERY_WAIT`] (the fault's record then says so).
    async fn until_settled(&self, rules: &[String], at: Instant) {
        let mut settled_since: Option<Instant> = None;
        loop {
            if let Some(t) = self.resumed(rules, at) {
                let since = *settled_since.get_or_insert(t);
                if since.elapsed() >= Duration::from_secs(2) {
                    break;
                }
            } else if at.elapsed() > RECOVERY_WAIT {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Keeps a backlog in both rules while kills remain: a rule with less than a second's
    /// worth of calls pending gets `more` records of `phase`.
    async fn top_up(&mut self, phase: &'static str, more: usize) -> anyhow::Result<()> {
        let rate = self.options.rate as i64;
        for (rule, n) in self.pending().await? {
            if n < rate {
                let rule = HEALTHY_RULES
                    .into_iter()
                    .find(|r| *r == rule)
                    .expect("a healthy rule");
                self.enqueue_rule(phase, rule, more).await?;
            }
        }
        Ok(())
    }

    /// A random busy worker (executing a chain job or holding a lease), watched for up to
    /// two seconds for one to be busy; a random idle one when none is.
    async fn pick_victim(&mut self, workers: &mut Workers) -> anyhow::Result<Victim> {
        workers.reap();
        let pids = workers.pids();
        let mut busy = self.busy(&pids).await?;
        for _ in 0..40 {
            if !busy.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            busy = self.busy(&pids).await?;
        }
        let mut victim = if busy.is_empty() {
            Victim {
                pid: pids[self.rng.random_range(0..pids.len())],
                busy: false,
                rules: Vec::new(),
            }
        } else {
            let candidates: Vec<u32> = busy.keys().copied().collect();
            let pid = candidates[self.rng.random_range(0..candidates.len())];
            Victim {
                pid,
                busy: true,
                rules: busy.remove(&pid).unwrap_or_default(),
            }
        };
        victim.rules.sort();
        victim.rules.dedup();
        Ok(victim)
    }

    /// The fleet rolls: `rolling` SIGKILLs, `rolling_every` apart whatever the last one
    /// cost, each followed at once by a replacement; odd kills hit a worker holding a
    /// rule's lease (the oldest when none does), even ones the oldest worker.
    async fn rolling_phase(&mut self, workers: &mut Workers) -> anyhow::Result<()> {
        const PHASE: &str = "rolling";
        let records = self.options.records;
        let kills = self.options.rolling;
        let from = Instant::now();
        self.enqueue(PHASE, records).await?;
        // The first kill once delivery is under way.
        self.until_arrived(PHASE, (records / 20).max(1)).await?;
        let mut next = Instant::now();
        for i in 1..=kills {
            tokio::time::sleep_until(next.into()).await;
            next += self.options.rolling_every;
            workers.reap();
            let pids = workers.pids();
            anyhow::ensure!(!pids.is_empty(), "no worker left to kill");
            let busy = self.busy(&pids).await?;
            let oldest = pids[0];
            let as_holder = i % 2 == 1 && !busy.is_empty();
            let victim = if as_holder {
                let candidates: Vec<u32> = busy.keys().copied().collect();
                candidates[self.rng.random_range(0..candidates.len())]
            } else {
                oldest
            };
            let victim_rules = busy.get(&victim).cloned().unwrap_or_default();
            let mut victim_rules = victim_rules;
            victim_rules.sort();
            victim_rules.dedup();
            let backlog = self.backlog().await?;
            let in_flight = self.target.in_flight();
            let at = Instant::now();
            workers.kill_and_replace(victim)?;
            println!(
                "chaos: rolling kill {i}/{kills} at {:.1} s: pid {victim} ({}; {}), {in_flight} calls in flight",
                self.secs(at),
                if as_holder {
                    "a lease holder"
                } else {
                    "the oldest"
                },
                if victim_rules.is_empty() {
                    "held no lease".to_owned()
                } else {
                    format!("held {}", victim_rules.join(", "))
                }
            );
            self.marks.push(Mark {
                t: self.secs(at),
                until: None,
                label: format!("roll {i}"),
            });
            self.record(FaultKind::Roll, at, None, in_flight, backlog);
            let f = self.faults.last_mut().expect("just recorded");
            f.victim_busy = busy.contains_key(&victim);
            f.victim_rules = victim_rules;
        }
        self.drain(PHASE, from).await
    }

    fn record(
        &mut self,
        kind: FaultKind,
        at: Instant,
        answering: Option<Instant>,
        in_flight: usize,
        backlog: Vec<String>,
    ) {
        self.faults.push(FaultRecord {
            kind,
            at: self.secs(at),
            answering_at: answering.map(|t| self.secs(t)),
            victim_busy: false,
            victim_rules: Vec::new(),
            in_flight,
            backlog_rules: backlog,
            resumed_after: None,
            resumed_after_fault: None,
            duplicates: 0,
            bound: in_flight as u64 + u64::from(self.options.rate),
            worker_restarts: 0,
        });
        self.fault_instants.push((at, answering));
    }

    async fn db_phase(
        &mut self,
        phase: &'static str,
        records: usize,
        outage: Option<Duration>,
        workers: &mut Workers,
    ) -> anyhow::Result<()> {
        let from = Instant::now();
        self.enqueue(phase, records).await?;
        self.until_arrived(phase, records / 3).await?;
        let backlog = self.backlog().await?;
        let in_flight = self.target.in_flight();
        let (_, restarts_before) = workers.log_lines();
        let cluster = self.cluster.clone();
        let at = Instant::now();
        let kind = match outage {
            None => {
                tokio::task::spawn_blocking(move || cluster.restart()).await??;
                FaultKind::DbRestart
            }
            Some(wait) => {
                tokio::task::spawn_blocking({
                    let cluster = cluster.clone();
                    move || cluster.stop()
                })
                .await??;
                tokio::time::sleep(wait).await;
                tokio::task::spawn_blocking(move || cluster.start_again()).await??;
                FaultKind::DbOutage
            }
        };
        let answering = Instant::now();
        println!(
            "chaos: database {} at {:.1} s, answering again after {:.1} s",
            if outage.is_some() {
                "taken down"
            } else {
                "restarted"
            },
            self.secs(at),
            (answering - at).as_secs_f64()
        );
        self.marks.push(Mark {
            t: self.secs(at),
            until: Some(self.secs(answering)),
            label: phase.to_owned(),
        });
        self.record(kind, at, Some(answering), in_flight, backlog);
        self.drain(phase, from).await?;
        let (_, restarts_after) = workers.log_lines();
        self.faults
            .last_mut()
            .expect("just recorded")
            .worker_restarts = restarts_after.saturating_sub(restarts_before);
        workers.reap();
        Ok(())
    }

    /// One skew: the oldest worker stopped cleanly and replaced by one whose wall clock is
    /// off by `skew` (libfaketime), a burst of as many records as the database phases
    /// drained by the fleet, then the skewed worker replaced by a plain one again.
    async fn skew_phase(
        &mut self,
        i: usize,
        skew: &str,
        workers: &mut Workers,
    ) -> anyhow::Result<()> {
        let lib = match skew {
            NO_SKEW => String::new(),
            _ => workers.faketime()?,
        };
        workers.stop_oldest()?;
        let beating = workers.live.len() + 1;
        match skew {
            NO_SKEW => workers.spawn()?,
            _ => workers.spawn_with(&[
                ("LD_PRELOAD", lib.as_str()),
                ("FAKETIME", skew),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ])?,
        }
        workers.until_beating(&self.pool, beating).await?;
        // The key's parts are split at '-': the phase's name carries the skew's index.
        let phase: &'static str = Box::leak(format!("skew{i}").into_boxed_str());
        let records = (self.options.records / 2).max(6);
        let at = Instant::now();
        let in_flight = self.target.in_flight();
        self.record(FaultKind::Skew, at, None, in_flight, Vec::new());
        self.marks.push(Mark {
            t: self.secs(at),
            until: None,
            label: format!("skew {skew}"),
        });
        self.enqueue(phase, records).await?;
        self.drain(phase, at).await?;
        let drained = at.elapsed().as_secs_f64();
        // The offset `courier status` shows, the largest of the live workers'.
        let window = chrono::Duration::seconds(DEFAULT_WORKER_DEAD_AFTER_SECS as i64);
        let offsets: Vec<f64> = (workers::live(&self.pool, chrono::Utc::now(), window).await?)
            .iter()
            .filter_map(|w| w.clock_offset_ms)
            .max_by(|a, b| a.abs().total_cmp(&b.abs()))
            .map(|ms| ms / 1000.0)
            .into_iter()
            .collect();
        let ideal = records as f64 / f64::from(self.options.rate);
        println!(
            "chaos: skew {skew}: {records} records drained in {drained:.1} s ({:.2} x ideal); offset shown {}",
            drained / ideal,
            offsets
                .first()
                .map_or("unknown".into(), |o| format!("{o:+.3} s"))
        );
        self.skews.push(SkewRecord {
            skew: skew.to_owned(),
            records,
            drain_ratio: drained / ideal,
            measured_offset: offsets.first().copied(),
        });
        workers.stop_newest()?;
        workers.spawn()?;
        workers.until_beating(&self.pool, beating).await?;
        workers.reap();
        Ok(())
    }

    /// Writes the poison rows by plain SQL beside a healthy burst, waits for the burst to
    /// drain and the watch to end, then records what the rows led to: failed runs, runs
    /// of the unusable rules, log lines and chain worker restarts over the watch.
    async fn poison_phase(&mut self, workers: &mut Workers) -> anyhow::Result<()> {
        const PHASE: &str = "poison";
        let from = Instant::now();
        let (lines_before, restarts_before) = workers.log_lines();
        let db_from = retry(|| Clock::synced(&self.pool)).await?.now();
        let mut rows = self.inject_poison_rows().await?;
        self.marks.push(Mark {
            t: self.secs(from),
            until: None,
            label: "poison".into(),
        });
        let records = (self.options.records / 3).max(6);
        self.enqueue(PHASE, records).await?;
        self.drain(PHASE, from).await?;
        let watch_end = from + self.options.poison_watch;
        if let Some(left) = watch_end.checked_duration_since(Instant::now()) {
            tokio::time::sleep(left).await;
        }
        let watched = from.elapsed().as_secs_f64();
        let (lines_after, restarts_after) = workers.log_lines();
        let since = retry(|| runs::count_by_rule(&self.pool, Some(db_from))).await?;
        let failed_runs: i64 = (since.iter().filter(|r| r.status == "failed"))
            .map(|r| r.runs)
            .sum();
        let poison_runs: i64 = (since
            .iter()
            .filter(|r| ["typo", "nokey"].contains(&&*r.rule)))
        .map(|r| r.runs)
        .sum();
        for (name, state) in self.poison_row_states().await? {
            rows.entry(name).or_insert(state);
        }
        let failed_reasons = self.failed_reasons(db_from).await?;
        self.poison = Some(PoisonRecord {
            watched,
            failed_runs,
            poison_runs,
            log_lines: lines_after.saturating_sub(lines_before),
            worker_restarts: restarts_after.saturating_sub(restarts_before),
            rows,
            failed_reasons,
        });
        Ok(())
    }

    /// Fault injection: writes the poison rows by plain SQL, behind the catalog's back on
    /// purpose, as a careless operator or a bad migration would (timestamps past chrono's
    /// range, a mistyped rule path, a connection whose key variable is unset: what the
    /// catalog would refuse), and a backlog for the two unusable rules through the
    /// documented `INSERT INTO deliveries ... SELECT`. Returns the rows the schema refused,
    /// with why.
    async fn inject_poison_rows(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let mut rows = BTreeMap::new();
        let url = self.target.workspace_url(WORKSPACE);
        let statements: Vec<(&str, String)> = vec![
                (
                    "hold_until infinity",
                    "INSERT INTO deliveries (rule_id, record_key, payload, hold_until)
                     SELECT id, 'poisonrow-infinity', '{\"custom_id\": \"poisonrow-infinity\"}', 'infinity'
                     FROM rules WHERE name = 'customers'"
                        .to_owned(),
                ),
                (
                    "hold_until year 290000",
                    "INSERT INTO deliveries (rule_id, record_key, payload, hold_until)
                     SELECT id, 'poisonrow-290000', '{\"custom_id\": \"poisonrow-290000\"}', '290000-01-01 00:00:00+00'
                     FROM rules WHERE name = 'orders'"
                        .to_owned(),
                ),
                (
                    "rule path users/{payload.custom_id}/",
                    "INSERT INTO rules (name, connection_id, path)
                     SELECT 'typo', id, 'users/{payload.custom_id}/' FROM connections WHERE name = 'shop'"
                        .to_owned(),
                ),
                (
                    "connection with its key variable unset",
                    format!(
                        "WITH c AS (INSERT INTO connections (name, writer, base_url, api_key_env)
                                    VALUES ('nokey', 'http_json', '{url}', '{UNSET_KEY_VAR}') RETURNING id)
                         INSERT INTO rules (name, connection_id, path) SELECT 'nokey', id, 'users/update_or_create/' FROM c"
                    ),
                ),
        ];
        for (name, sql) in &statements {
            let inserted = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .execute(&self.pool)
                .await;
            if let Err(e) = inserted {
                rows.insert((*name).to_owned(), format!("refused at the door: {e}"));
            }
        }
        // Backlogs for the two unusable rules, by plain SQL (the catalog may refuse them).
        for rule in ["typo", "nokey"] {
            sqlx::query(
                "INSERT INTO deliveries (rule_id, record_key, payload)
                 SELECT r.id, 'poisonrow-' || r.name || '-' || g,
                        jsonb_build_object('custom_id', 'poisonrow-' || r.name || '-' || g)
                 FROM rules r, generate_series(1, 20) g WHERE r.name = $1",
            )
            .bind(rule)
            .execute(&self.pool)
            .await?;
        }
        Ok(rows)
    }

    /// What became of each poison row: its deliveries' statuses and count, by row name (the
    /// harness's own measurement over `deliveries`, by the poison rows' keys).
    async fn poison_row_states(&self) -> anyhow::Result<Vec<(String, String)>> {
        retry(|| {
            sqlx::query_as(
                "SELECT CASE WHEN d.record_key LIKE 'poisonrow-typo-%' THEN 'rule path users/{payload.custom_id}/'
                             WHEN d.record_key LIKE 'poisonrow-nokey-%' THEN 'connection with its key variable unset'
                             WHEN d.record_key = 'poisonrow-infinity' THEN 'hold_until infinity'
                             ELSE 'hold_until year 290000' END,
                        string_agg(DISTINCT d.status, ', ') || ' (' || count(*) || ' deliveries)'
                 FROM deliveries d WHERE d.record_key LIKE 'poisonrow-%' GROUP BY 1",
            )
            .fetch_all(&self.pool)
        })
        .await
    }

    /// The errors of the first ten runs that failed since `since` (database time), each
    /// as `rule: error`, for the report.
    async fn failed_reasons(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> anyhow::Result<Vec<String>> {
        let failures = retry(|| runs::failures(&self.pool, since, 10)).await?;
        Ok(failures
            .into_iter()
            .map(|f| {
                let error = f.error.map(|e| e.chars().take(160).collect::<String>());
                format!("{}: {}", f.rule, error.as_deref().unwrap_or("?"))
            })
            .collect())
    }

    /// The apalis job whose id is not a ULID, beside a small healthy burst: watched for
    /// [`APALIS_WATCH`]; then, if the healthy burst has not arrived, the harness deletes
    /// the row (the operator's workaround) and measures how long the burst then takes.
    async fn apalis_phase(&mut self, workers: &mut Workers) -> anyhow::Result<()> {
        const PHASE: &str = "apalis";
        let from = Instant::now();
        let (lines_before, restarts_before) = workers.log_lines();
        let inserted = unreadable_job(&self.pool, Injection::Write).await;
        self.marks.push(Mark {
            t: self.secs(from),
            until: None,
            label: "apalis row".into(),
        });
        let records = (self.options.records / 6).max(4);
        self.enqueue(PHASE, records).await?;
        let mut record = ApalisRecord {
            refused: inserted.err().map(|e| e.to_string()),
            enqueued: records as u64,
            ..ApalisRecord::default()
        };
        let watch_end = Instant::now() + APALIS_WATCH;
        while Instant::now() < watch_end && self.arrived(PHASE) < records {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        record.watched = from.elapsed().as_secs_f64();
        record.arrived_while_there = self.arrived(PHASE) as u64;
        let (lines_after, restarts_after) = workers.log_lines();
        record.log_lines = lines_after.saturating_sub(lines_before);
        record.worker_restarts = restarts_after.saturating_sub(restarts_before);
        let row = retry(|| queue::chain_row(&self.pool, UNREADABLE_JOB)).await?;
        record.row = match row {
            Some(queue::ChainRow {
                status,
                attempts,
                last_result,
            }) => format!(
                "status {status}, attempts {attempts}{}",
                last_result
                    .map(|r| format!(", last result {r}"))
                    .unwrap_or_default()
            ),
            None => "removed by courier".into(),
        };
        if record.arrived_while_there < records as u64 {
            let removed = Instant::now();
            retry(|| unreadable_job(&self.pool, Injection::Remove)).await?;
            self.marks.push(Mark {
                t: self.secs(removed),
                until: None,
                label: "row deleted".into(),
            });
            self.drain(PHASE, from).await?;
            record.drained_after_removal = Some(removed.elapsed().as_secs_f64());
        } else {
            self.drain(PHASE, from).await?;
        }
        self.apalis = Some(record);
        Ok(())
    }

    /// Everything measured, from the target's log and the database.
    async fn outcome(&mut self, workers: &Workers) -> anyhow::Result<ChaosOutcome> {
        let log = self.target.accepted_log();
        let (duplicates, unexplained) = self.charge_duplicates(&log);
        self.time_recoveries(&log);
        let rolling_stall = self.rolling_stall(&log);
        let longest = self.longest_pause(&log);
        let losses = self.losses().await?;
        let runs_left_active: i64 = (retry(|| runs::count_by_rule(&self.pool, None)).await?)
            .iter()
            .filter(|r| HEALTHY_RULES.contains(&r.rule.as_str()))
            .filter(|r| ["running", "waiting"].contains(&r.status.as_str()))
            .map(|r| r.runs)
            .sum();
        Ok(ChaosOutcome {
            faults: self.faults.clone(),
            enqueued: losses.enqueued,
            lost: losses.lost,
            not_delivered: losses.not_delivered,
            never_arrived: losses.never_arrived,
            duplicates,
            unexplained_duplicates: unexplained,
            longest_pause: longest.0,
            longest_pause_where: longest.1,
            rolling_stall,
            workers_died: workers.died,
            runs_left_active,
            poison: self.poison.clone(),
            apalis: self.apalis.clone(),
            skews: self.skews.clone(),
            throttled: self.target.counters().throttled,
        })
    }

    /// Counts the accepted writes of a record accepted before and charges each to the
    /// last fault before it arrived; returns (all duplicates, those before any fault).
    fn charge_duplicates(&mut self, log: &[AcceptedWrite]) -> (u64, u64) {
        let mut arrivals: HashMap<&str, Vec<Instant>> = HashMap::new();
        for w in log.iter().filter(|w| parse_key(&w.key).is_some()) {
            arrivals.entry(w.key.as_str()).or_default().push(w.arrived);
        }
        let mut unexplained = 0;
        let mut duplicates = 0;
        for times in arrivals.values() {
            for t in times.iter().skip(1) {
                duplicates += 1;
                match self.fault_instants.iter().rposition(|(at, _)| at <= t) {
                    Some(i) => self.faults[i].duplicates += 1,
                    None => unexplained += 1,
                }
            }
        }
        (duplicates, unexplained)
    }

    /// Sets each fault's recovery times: from the fault (or from the database answering
    /// again) until every rule that had a backlog was called again.
    fn time_recoveries(&mut self, log: &[AcceptedWrite]) {
        for (f, (at, answering)) in self.faults.iter_mut().zip(&self.fault_instants) {
            let from = answering.unwrap_or(*at);
            let resumed = resumed_at(log, &f.backlog_rules, from);
            f.resumed_after = resumed.map(|t| (t - from).as_secs_f64());
            f.resumed_after_fault = resumed.map(|t| (t - *at).as_secs_f64());
        }
    }

    /// The rolling phase, when it ran: the longest time no record of it arrived, from
    /// its first kill until it drained (s).
    fn rolling_stall(&self, log: &[AcceptedWrite]) -> Option<f64> {
        self.phases
            .iter()
            .find(|p| p.name == "rolling")
            .zip(
                self.fault_instants
                    .iter()
                    .zip(&self.faults)
                    .find(|(_, f)| f.kind == FaultKind::Roll),
            )
            .map(|(phase, ((first_kill, _), _))| {
                let mut times: Vec<Instant> = log
                    .iter()
                    .filter(|w| parse_key(&w.key).is_some_and(|(p, _)| p == phase.name))
                    .map(|w| w.arrived)
                    .filter(|t| *t >= *first_kill && *t <= phase.to)
                    .collect();
                times.push(*first_kill);
                times.sort();
                times
                    .windows(2)
                    .map(|pair| (pair[1] - pair[0]).as_secs_f64())
                    .fold(0.0, f64::max)
            })
    }

    /// The longest gap between two calls of one healthy rule within a phase (s), and
    /// where (`phase/rule`).
    fn longest_pause(&self, log: &[AcceptedWrite]) -> (f64, String) {
        let mut longest = (0.0, String::new());
        for phase in &self.phases {
            for rule in HEALTHY_RULES {
                let mut times: Vec<Instant> = log
                    .iter()
                    .filter(|w| parse_key(&w.key) == Some((phase.name, rule)))
                    .map(|w| w.arrived)
                    .filter(|t| *t >= phase.from && *t <= phase.to)
                    .collect();
                times.sort();
                for pair in times.windows(2) {
                    let gap = (pair[1] - pair[0]).as_secs_f64();
                    if gap > longest.0 {
                        longest = (gap, format!("{}/{rule}", phase.name));
                    }
                }
            }
        }
        longest
    }

    /// Lost records: every healthy record must be delivered in the database and
    /// accepted by the target (the harness's own measurement over `deliveries`, its
    /// healthy rows told apart from the poison by their keys).
    async fn losses(&self) -> anyhow::Result<Losses> {
        let healthy: Vec<(String, String)> = retry(|| {
            sqlx::query_as(
                "SELECT d.record_key, d.status FROM deliveries d JOIN rules r ON r.id = d.rule_id
                 WHERE r.name = ANY($1) AND d.record_key NOT LIKE 'poisonrow-%'",
            )
            .bind(HEALTHY_RULES.map(String::from).to_vec())
            .fetch_all(&self.pool)
        })
        .await?;
        let mut losses = Losses {
            enqueued: healthy.len() as u64,
            ..Losses::default()
        };
        for (key, status) in &healthy {
            let missing = self.target.accepted(&format!("user:{key}")) == 0;
            let undelivered = status != "delivered";
            losses.not_delivered += u64::from(undelivered);
            losses.never_arrived += u64::from(missing);
            losses.lost += u64::from(undelivered || missing);
        }
        Ok(losses)
    }
}

/// When every rule of `rules` had a call arrive after `since` (the latest of their first
/// arrivals); `None` when some rule had none.
fn resumed_at(log: &[AcceptedWrite], rules: &[String], since: Instant) -> Option<Instant> {
    let mut latest = since;
    for rule in rules {
        let first = log
            .iter()
            .filter(|w| w.arrived > since)
            .filter(|w| parse_key(&w.key).is_some_and(|(_, r)| r == rule))
            .map(|w| w.arrived)
            .min()?;
        latest = latest.max(first);
    }
    Some(latest)
}

/// The id of the chain queue's row courier cannot read, which the apalis phase injects.
const UNREADABLE_JOB: &str = "not-a-ulid";

/// What [`unreadable_job`] does to the queue's table.
#[derive(Clone, Copy, Debug)]
enum Injection {
    /// Writes the row.
    Write,
    /// Deletes it again (the operator's workaround when it stops delivery).
    Remove,
}

/// Fault injection: writes (or deletes) a row of the chain queue whose id is not a ULID
/// straight into apalis' table, as a hostile writer of the queue would, behind its owner
/// (`courier::queue::table`) on purpose: the fault the apalis phase measures. What became
/// of the row is read back through the owner ([`queue::chain_row`]).
async fn unreadable_job(
    pool: &PgPool,
    injection: Injection,
) -> Result<sqlx::postgres::PgQueryResult, sqlx::Error> {
    match injection {
        Injection::Write => {
            sqlx::query(
                "INSERT INTO apalis.jobs (job, id, job_type, status)
                 VALUES (convert_to('{\"run_id\": 0, \"rule_id\": 0}', 'UTF8'), $1, $2, 'Pending')",
            )
            .bind(UNREADABLE_JOB)
            .bind(queue::CHAIN_QUEUE)
            .execute(pool)
            .await
        }
        Injection::Remove => {
            sqlx::query("DELETE FROM apalis.jobs WHERE id = $1")
                .bind(UNREADABLE_JOB)
                .execute(pool)
                .await
        }
    }
}

/// Runs a harness statement again while the database is away (up to two minutes).
async fn retry<T, E, F, Fut>(mut statement: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    let limit = Instant::now() + Duration::from_secs(120);
    loop {
        match statement().await {
            Ok(v) => return Ok(v),
            // The harness's own statements fail while the database is away: expected.
            Err(_) if Instant::now() < limit => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes what the database holds about runs, jobs, leases and workers to `path`, for
/// a run that failed (best effort: the database may be away). A post-mortem dump of the
/// raw rows, read only, to see what the owners' functions may have got wrong: it reads
/// behind them on purpose.
async fn dump_state(pool: &PgPool, path: &std::path::Path) {
    let queries = [
        "SELECT now()::text",
        "SELECT string_agg(format('%s %s %s', r.name, d.status, d.n), E'\\n') FROM \
         (SELECT rule_id, status, count(*) n FROM deliveries GROUP BY 1, 2) d JOIN rules r ON r.id = d.rule_id",
        "SELECT string_agg(format('run %s rule %s %s jobs %s delivered %s cursor %s heartbeat %s job %s error %s', \
         id, rule_id, status, jobs, delivered, cursor_id, heartbeat_at, job_id, error), E'\\n' ORDER BY id) FROM runs",
        "SELECT string_agg(format('rule %s %s lease %s until %s', id, name, lease_owner, lease_until), E'\\n') FROM rules",
        "SELECT string_agg(format('job %s %s attempts %s run_at %s lock_by %s lock_at %s done %s result %s', \
         id, status, attempts, run_at, lock_by, lock_at, done_at, last_result), E'\\n' ORDER BY run_at) \
         FROM apalis.jobs",
        "SELECT string_agg(format('worker %s beat %s', name, heartbeat_at), E'\\n') FROM workers",
        "SELECT string_agg(format('apalis worker %s last_seen %s', id, last_seen), E'\\n') FROM apalis.workers",
    ];
    let mut out = String::new();
    for q in queries {
        let row: Result<Option<String>, _> = sqlx::query_scalar(sqlx::AssertSqlSafe(q))
            .fetch_one(pool)
            .await;
        match row {
            Ok(v) => out.push_str(&v.unwrap_or_default()),
            Err(e) => out.push_str(&format!("{q}: {e}")),
        }
        out.push_str("\n\n");
    }
    let _ = std::fs::write(path, out);
}

/// Samples the target's counters every [`SAMPLE_EVERY`] until told to stop (the
/// database may be down: nothing here reads it).
async fn sample(target: Target, started: Instant, running: Arc<AtomicBool>) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    while running.load(Ordering::SeqCst) {
        tick.tick().await;
        let c = target.counters();
        samples.push(Sample {
            t: Instant::now()
                .saturating_duration_since(started)
                .as_secs_f64(),
            requests: c.requests,
            throttled: c.throttled,
            delivered: c.accepted_keys as i64,
            blocked: false,
            pace: None,
        });
    }
    samples
}

fn secs(v: Option<f64>) -> serde_json::Value {
    v.map_or(json!("never"), |s| json!((s * 10.0).round() / 10.0))
}

fn verdict(held: bool) -> &'static str {
    if held { "held" } else { "MISSED" }
}

/// The report's figures, in display order.
fn figures(report: &mut Report, o: &ChaosOptions, out: &ChaosOutcome, target: &Target) {
    setup_figures(report, o);
    delivery_figures(report, out, target);
    let kills: Vec<&FaultRecord> = out.of(FaultKind::Kill).collect();
    kill_figures(report, o, &kills);
    let rolls: Vec<&FaultRecord> = out.of(FaultKind::Roll).collect();
    if !rolls.is_empty() {
        rolling_figures(report, o, out, &rolls);
    }
    database_figures(report, out);
    recovery_figures(report, out);
    if let Some(p) = &out.poison {
        poison_figures(report, p);
    }
    if let Some(a) = &out.apalis {
        apalis_figures(report, a);
    }
    // One fault record per skew, in the same order.
    for (f, k) in out.of(FaultKind::Skew).zip(&out.skews) {
        let dups = f.duplicates;
        report.figure(
            &format!("skew {}: drain / ideal, duplicates, offset shown", k.skew),
            format!(
                "{:.2}, {dups}, {}",
                k.drain_ratio,
                k.measured_offset
                    .map_or("none".into(), |o| format!("{o:+.3} s"))
            ),
        );
    }
    report.figure("goal: 0 lost", verdict(out.lost == 0));
}

/// How the run was set up, so a report can be read (and reproduced, by its seed) alone.
fn setup_figures(report: &mut Report, o: &ChaosOptions) {
    report.figure("worker processes", o.workers as u64);
    report.figure("declared rate (calls/s)", u64::from(o.rate));
    report.figure(
        "target latency (ms)",
        format!("{}–{}", o.latency.0.as_millis(), o.latency.1.as_millis()),
    );
    report.figure("max in flight per rule", o.max_in_flight as i64);
    report.figure("victim seed", o.seed.to_string());
}

/// The run's totals: records, calls, 429s, lost deliveries and duplicate sends.
fn delivery_figures(report: &mut Report, out: &ChaosOutcome, target: &Target) {
    report.figure("healthy records enqueued", out.enqueued);
    report.figure("calls", target.counters().requests);
    report.figure("429s", out.throttled);
    report.figure("lost deliveries", out.lost);
    report.figure("  not delivered in the database", out.not_delivered);
    report.figure("  never accepted by the target", out.never_arrived);
    report.figure("duplicate sends (all faults)", out.duplicates);
    report.figure("  before any fault", out.unexplained_duplicates);
}

/// The longest recovery of these faults (s); `None` when some fault never recovered.
fn worst_recovery(faults: &[&FaultRecord]) -> Option<f64> {
    faults
        .iter()
        .map(|f| f.resumed_after)
        .try_fold(0.0f64, |m, r| r.map(|r| m.max(r)))
}

/// A fault's recovery as text: `1.2 s`, or `never`.
fn resumed_in(f: &FaultRecord) -> String {
    f.resumed_after
        .map_or("never".into(), |s| format!("{s:.1} s"))
}

/// `n of m` kills whose victim held a lease.
fn lease_holders(faults: &[&FaultRecord]) -> String {
    format!(
        "{} of {}",
        faults.iter().filter(|f| !f.victim_rules.is_empty()).count(),
        faults.len()
    )
}

/// The kill phase: a line per kill, then recovery and duplicates over every kill and
/// the goals they are held to (nothing when no kill ran).
fn kill_figures(report: &mut Report, o: &ChaosOptions, kills: &[&FaultRecord]) {
    for (i, f) in kills.iter().enumerate() {
        let victim = if f.victim_rules.is_empty() {
            if f.victim_busy { "busy" } else { "idle" }.to_owned()
        } else {
            format!("held {}", f.victim_rules.join("+"))
        };
        report.figure(
            &format!("kill {}", i + 1),
            format!(
                "victim {victim}; {} in flight; resumed in {}; {} duplicates (bound {})",
                f.in_flight,
                resumed_in(f),
                f.duplicates,
                f.bound
            ),
        );
    }
    if kills.is_empty() {
        return;
    }
    let worst = worst_recovery(kills);
    let mut resumed: Vec<f64> = kills.iter().filter_map(|f| f.resumed_after).collect();
    resumed.sort_by(f64::total_cmp);
    report.figure("kills of a worker holding a lease", lease_holders(kills));
    report.figure(
        "kill → every backlog rule called again, max (s)",
        secs(worst),
    );
    report.figure(
        "kill → called again, median (s)",
        secs(resumed.get(resumed.len() / 2).copied()),
    );
    let dup: u64 = kills.iter().map(|f| f.duplicates).sum();
    report.figure("duplicates after kills", dup);
    report.figure(
        "duplicates per kill, max",
        kills.iter().map(|f| f.duplicates).max().unwrap_or(0),
    );
    report.figure(
        "kills over the bound (in flight + 1 s of calls)",
        kills.iter().filter(|f| f.duplicates > f.bound).count() as u64,
    );
    let fair = (o.max_in_flight as u64) * o.workers as u64;
    report.figure(
        "kills over max_in_flight × workers",
        format!(
            "{} (bound {fair})",
            kills.iter().filter(|f| f.duplicates > fair).count()
        ),
    );
    report.figure(
        "goal: called again ≤ 30 s after every kill",
        verdict(worst.is_some_and(|w| w <= 30.0)),
    );
    report.figure(
        "goal: duplicates per kill ≤ in flight + 1 s of calls",
        verdict(kills.iter().all(|f| f.duplicates <= f.bound)),
    );
}

/// The rolling phase: its pace, a line per kill, the worst recovery, the longest stall
/// and the goal it is held to.
fn rolling_figures(
    report: &mut Report,
    o: &ChaosOptions,
    out: &ChaosOutcome,
    rolls: &[&FaultRecord],
) {
    report.figure("rolling: kills", rolls.len() as u64);
    report.figure(
        "rolling: time between kills (s)",
        o.rolling_every.as_secs_f64(),
    );
    report.figure(
        "rolling: kills of a worker holding a lease",
        lease_holders(rolls),
    );
    for (i, f) in rolls.iter().enumerate() {
        report.figure(
            &format!("rolling kill {}", i + 1),
            format!(
                "victim {}; {} in flight; every backlog rule called again in {}; {} duplicates",
                if f.victim_rules.is_empty() {
                    "held no lease".to_owned()
                } else {
                    format!("held {}", f.victim_rules.join("+"))
                },
                f.in_flight,
                resumed_in(f),
                f.duplicates,
            ),
        );
    }
    let worst = worst_recovery(rolls);
    report.figure(
        "rolling: kill → every backlog rule called again, max (s)",
        secs(worst),
    );
    report.figure(
        "rolling: longest delivery stall (s)",
        secs(out.rolling_stall),
    );
    report.figure(
        "rolling: duplicates",
        rolls.iter().map(|f| f.duplicates).sum::<u64>(),
    );
    report.figure(
        "goal: rolling: called again ≤ 10 s after every kill",
        verdict(worst.is_some_and(|w| w <= 10.0)),
    );
}

/// Each database fault: how long it was down, the recovery after it answered again,
/// duplicates, chain worker restarts and the goal it is held to.
fn database_figures(report: &mut Report, out: &ChaosOutcome) {
    for f in out
        .faults
        .iter()
        .filter(|f| matches!(f.kind, FaultKind::DbRestart | FaultKind::DbOutage))
    {
        let name = match f.kind {
            FaultKind::DbRestart => "database restart",
            _ => "database outage",
        };
        let down = f.answering_at.unwrap_or(f.at) - f.at;
        report.figure(&format!("{name}: down (s)"), secs(Some(down)));
        report.figure(
            &format!("{name}: answering → every backlog rule called again (s)"),
            secs(f.resumed_after),
        );
        report.figure(
            &format!("{name}: fault → called again (s)"),
            secs(f.resumed_after_fault),
        );
        report.figure(
            &format!("{name}: duplicates (bound {})", f.bound),
            f.duplicates,
        );
        report.figure(
            &format!("{name}: chain worker restarts (each drops its jobs)"),
            f.worker_restarts,
        );
        report.figure(
            &format!("goal: {name}: called again ≤ 10 s after the database answers"),
            verdict(f.resumed_after.is_some_and(|r| r <= 10.0)),
        );
    }
}

/// Over the whole run: the longest pause of a rule with a backlog, the recovery after
/// the last fault, workers that died by themselves and runs left active.
fn recovery_figures(report: &mut Report, out: &ChaosOutcome) {
    report.figure(
        "longest pause of a rule with a backlog (s)",
        secs(Some(out.longest_pause)),
    );
    report.figure("  where (phase/rule)", out.longest_pause_where.clone());
    if let Some(last) = out.faults.last() {
        let what = match last.kind {
            FaultKind::Kill => "the last kill → called again",
            FaultKind::Roll => "the last rolling kill → called again",
            FaultKind::DbRestart => "the last fault (restart): answering → called again",
            FaultKind::DbOutage => "the last fault (outage): answering → called again",
            FaultKind::Skew => "the last skewed worker's start → called again",
        };
        report.figure(
            &format!("recovery after {what} (s)"),
            secs(last.resumed_after),
        );
    }
    report.figure(
        "worker processes that died by themselves",
        out.workers_died as u64,
    );
    report.figure("healthy runs left running or waiting", out.runs_left_active);
}

/// The poison phase: failed runs, runs of the unusable rules, log noise, what each row
/// led to, the goals it is held to and the first failed runs' errors.
fn poison_figures(report: &mut Report, p: &PoisonRecord) {
    report.figure("poison: watched (s)", secs(Some(p.watched)));
    report.figure("poison: failed runs", p.failed_runs);
    report.figure(
        "poison: failed runs per second",
        p.failed_runs as f64 / p.watched.max(1.0),
    );
    report.figure("poison: runs of the unusable rules", p.poison_runs);
    report.figure(
        "poison: worker log lines per second",
        p.log_lines as f64 / p.watched.max(1.0),
    );
    report.figure("poison: chain worker restarts", p.worker_restarts);
    for (row, state) in &p.rows {
        report.figure(&format!("poison row: {row}"), state.clone());
    }
    let state = |row: &str| p.rows.get(row).map_or("", String::as_str);
    report.figure(
        "goal: an unusable connection or rule fails once, then waits",
        verdict(p.poison_runs <= 2),
    );
    report.figure(
        "goal: the mistyped rule's backlog stays pending",
        verdict(
            state("rule path users/{payload.custom_id}/").starts_with("pending")
                || state("rule path users/{payload.custom_id}/").starts_with("refused"),
        ),
    );
    for (i, reason) in p.failed_reasons.iter().enumerate() {
        report.figure(&format!("poison: failed run {}", i + 1), reason.clone());
    }
}

/// The apalis row phase: whether the row got in, what healthy delivery did beside it,
/// the log noise, the row's state, whether the harness had to delete it, and the goal.
fn apalis_figures(report: &mut Report, a: &ApalisRecord) {
    if let Some(refused) = &a.refused {
        report.figure("apalis row: refused at the door", refused.clone());
    }
    report.figure("apalis row: watched (s)", secs(Some(a.watched)));
    report.figure(
        "apalis row: healthy records arrived while it sat there",
        format!("{} of {}", a.arrived_while_there, a.enqueued),
    );
    report.figure(
        "apalis row: worker log lines per second",
        a.log_lines as f64 / a.watched.max(1.0),
    );
    report.figure(
        "apalis row: chain worker restarts per second",
        a.worker_restarts as f64 / a.watched.max(1.0),
    );
    report.figure("apalis row: its state", a.row.clone());
    report.figure(
        "apalis row: deleted by the harness; burst delivered after (s)",
        a.drained_after_removal
            .map_or(json!("not needed"), |s| secs(Some(s))),
    );
    report.figure(
        "goal: an apalis row courier cannot read stops nothing",
        verdict(a.arrived_while_there == a.enqueued),
    );
}
