//! The `courier` command line: parses arguments, starts telemetry, loads and validates the
//! settings, and hands over to the engine library (`courier`), the local target
//! (`courier_target`) or this crate's demo and benchmarks.

use std::{io::Read, path::PathBuf, sync::Arc};

use anyhow::Context;
use clap::{Parser, Subcommand};
use courier::{
    catalog::{self, NewConnection, NewRule},
    config::{self, Settings},
    db, enqueue,
    ledger::Outcome,
    ops, status,
    worker::{self, Engine},
};
use courier_cli::{bench, demo, web};
use courier_target::{self as target, WorkspaceConfig};

/// Delivers shop records into marketing and CRM targets through a PostgreSQL job queue.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply courier's and apalis' migrations (the worker does this at start too).
    Migrate,
    /// Manage the database itself.
    #[command(subcommand)]
    Db(DbCmd),
    /// Run the worker: dispatcher, reaper and chain jobs, until SIGTERM or Ctrl-C; serves
    /// metrics and the dashboard on COURIER_HTTP_ADDR (unset: 127.0.0.1:9187, or the next
    /// free port up to 9196 when another worker holds it, past them any; empty: off).
    Worker,
    /// Enqueue deliveries for a rule from NDJSON (stdin or a file), all or nothing.
    Enqueue {
        /// The rule's name.
        #[arg(long)]
        rule: String,
        /// NDJSON file; stdin when absent.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Create or update connections and rules from a JSON file, all or nothing; prints what
    /// it created, changed and left alone. Fields the file leaves out keep their stored
    /// values.
    Apply {
        /// `{"connections": [...], "rules": [...]}`
        file: PathBuf,
        /// Check the file and print the changes without saving anything.
        #[arg(long)]
        dry_run: bool,
        /// Fields the file leaves out take their defaults instead of their stored values.
        #[arg(long)]
        replace: bool,
    },
    /// Manage target connections.
    #[command(subcommand)]
    Connection(ConnectionCmd),
    /// Manage rules.
    #[command(subcommand)]
    Rule(RuleCmd),
    /// Make a rule's exhausted (or rejected) deliveries pending again, with their attempts
    /// reset; a delivery whose key has a newer one pending or delivered is left alone.
    Retry {
        /// The rule's name.
        #[arg(long)]
        rule: String,
        /// Which deliveries: exhausted (default) or rejected (repeatable).
        #[arg(long = "outcome", value_enum)]
        outcomes: Vec<RetryOutcome>,
        /// Only those that ended at or after this time: RFC 3339
        /// (`2026-11-30T12:00:00Z`), a date (`2026-11-30`, UTC) or an age (`90m`, `2h`, `1d`).
        #[arg(long, value_parser = parse_since)]
        since: Option<chrono::DateTime<chrono::Utc>>,
    },
    /// Show one record key's deliveries and ledger rows, oldest first.
    History {
        /// The record key.
        key: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show connections, rules and recent runs.
    Status {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Run the end-to-end demo on a fresh `courier_demo` database with a local User.com target.
    Demo {
        /// Deliveries to enqueue (customers, consents and price changes).
        #[arg(long, default_value_t = demo::DEFAULT_RECORDS)]
        records: usize,
        /// The target workspace's limit in requests per second (declared as 60x per minute).
        #[arg(long, default_value_t = demo::DEFAULT_RATE)]
        rate: u32,
    },
    /// Run the local User.com-like HTTP target until Ctrl-C.
    Target(TargetArgs),
    /// Run a benchmark scenario on a fresh database (`courier_bench`, on the server
    /// `DATABASE_URL` names) with a local target; prints a table and writes
    /// `<out>/<scenario>.json` and `<out>/<scenario>.svg`. Build with --release.
    Bench {
        /// pacing, throughput, latency, multi-worker, storm, idle-throttled, scale, limits,
        /// chaos, cold-start or soak.
        scenario: bench::Scenario,
        /// Records to enqueue (each scenario has its own default).
        #[arg(long)]
        records: Option<usize>,
        /// Worker processes for multi-worker (default 3) and chaos (default 2).
        #[arg(long)]
        workers: Option<usize>,
        /// chaos: SIGKILLs of a busy worker during the first burst (default 10).
        #[arg(long)]
        kills: Option<usize>,
        /// chaos: seconds the database stays down in the outage phase (default 30; 0
        /// skips it).
        #[arg(long)]
        outage_seconds: Option<u64>,
        /// chaos: leave out the apalis job whose id is not a ULID.
        #[arg(long)]
        skip_apalis_poison: bool,
        /// chaos: seed of the victim choice (random unless given).
        #[arg(long)]
        seed: Option<u64>,
        /// chaos: the phases to run, of kill, rolling, restart, outage, poison, apalis
        /// (default: all).
        #[arg(long, value_delimiter = ',')]
        phases: Option<Vec<String>>,
        /// limits: the limiter kinds to run, of fixed, sliding, gcra, token-bucket
        /// (default: all).
        #[arg(long, value_delimiter = ',')]
        limiters: Option<Vec<target::Window>>,
        /// limits: the ratios to run, of x1, x2, x5, x10, drop (default: all).
        #[arg(long, value_delimiter = ',')]
        ratios: Option<Vec<String>>,
        /// Where results go.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
        /// The database the run drops and creates (another name lets two checkouts
        /// benchmark on one server at once).
        #[arg(long, default_value = "courier_bench")]
        database: String,
    },
}

/// Options of `courier target`.
#[derive(clap::Args)]
struct TargetArgs {
    /// Port (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    bind: std::net::IpAddr,
    /// A workspace, `NAME:TOKEN` or `NAME:TOKEN:attr,attr` to declare its custom
    /// attributes (repeatable). Reach it at /ws/NAME/api/public/ or with Host NAME.<anything>.
    #[arg(long = "workspace", value_parser = WorkspaceConfig::parse)]
    workspaces: Vec<WorkspaceConfig>,
    /// Requests per second each workspace allows.
    #[arg(long, default_value_t = target::DEFAULT_RATE)]
    rate: u32,
    /// Limiter kind: fixed (1 s windows), sliding (log), gcra (leaky bucket, no burst
    /// unless --burst) or token-bucket (a burst of --burst, else one second's worth).
    #[arg(long = "limiter", visible_alias = "window", default_value = "fixed")]
    window: target::Window,
    /// The burst of a gcra or token-bucket limiter.
    #[arg(long)]
    burst: Option<u32>,
    /// Changes of the limit while running, AFTER:LIMIT[,...]: `10s:5` makes the limit 5
    /// per second from 10 s after the start (as if another client started using it).
    #[arg(long)]
    limit_schedule: Option<String>,
    /// Rate-limit headers every answer carries: none, ietf (RateLimit-Policy and
    /// RateLimit), x-ratelimit (reset in seconds) or x-ratelimit-epoch.
    #[arg(long, default_value = "none")]
    rate_headers: target::RateHeaders,
    /// What a 429 carries: seconds, http-date or none.
    #[arg(long, default_value = "seconds")]
    retry_after: target::RetryAfterMode,
    /// Share (0..1) of requests answered 500, 502 or 504.
    #[arg(long, default_value_t = 0.0)]
    fault_5xx: f64,
    /// Extra latency per request, uniform in MIN..MAX milliseconds.
    #[arg(long, value_parser = target::parse_latency_ms)]
    latency_ms: Option<(std::time::Duration, std::time::Duration)>,
    /// Share (0..1) of requests that hang past any client timeout.
    #[arg(long, default_value_t = 0.0)]
    hang: f64,
    /// Share (0..1) of requests whose connection is closed without an answer.
    #[arg(long, default_value_t = 0.0)]
    reset: f64,
}

#[derive(Subcommand)]
enum DbCmd {
    /// Create the database DATABASE_URL names, unless it exists (connects to the server's
    /// `postgres` database for that; the role needs CREATEDB). No other command creates
    /// it or connects anywhere but DATABASE_URL.
    Create,
}

#[derive(Subcommand)]
enum ConnectionCmd {
    /// Create a connection, or update the one with that name.
    Add {
        #[arg(long)]
        name: String,
        /// Writer kind.
        #[arg(long, default_value = "http_json")]
        writer: String,
        #[arg(long)]
        base_url: String,
        /// Environment variable holding the API key.
        #[arg(long)]
        api_key_env: Option<String>,
        /// Extra header, `Name: value` (repeatable).
        #[arg(long = "header")]
        headers: Vec<String>,
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..))]
        requests_per_minute: Option<i32>,
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..=1000))]
        max_in_flight: Option<i32>,
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..=600_000))]
        timeout_ms: Option<i32>,
        /// Share one budget and one rate-limit block with connections naming the same key
        /// (e.g. the workspace).
        #[arg(long)]
        budget_key: Option<String>,
    },
    /// List connections.
    List,
    /// Start no run for any rule of the connection; runs under way stop at their next
    /// batch. Survives restarts.
    Pause { name: String },
    /// Let the connection's rules run again.
    Resume { name: String },
    /// Lift the rate-limit block on the connection's budget now.
    Unblock { name: String },
}

/// The outcomes `courier retry` takes back.
#[derive(Clone, Copy, clap::ValueEnum)]
enum RetryOutcome {
    Exhausted,
    Rejected,
}

/// `--since`: an RFC 3339 time, a date (midnight UTC), or an age before now (`45s`, `90m`,
/// `2h`, `1d`).
fn parse_since(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    let s = s.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.to_utc());
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.and_time(chrono::NaiveTime::MIN).and_utc());
    }
    let unit = s.chars().last().unwrap_or(' ');
    let n: Option<i64> = s[..s.len() - unit.len_utf8().min(s.len())].parse().ok();
    let age = match (n, unit) {
        (Some(n), 's') => chrono::Duration::try_seconds(n),
        (Some(n), 'm') => chrono::Duration::try_minutes(n),
        (Some(n), 'h') => chrono::Duration::try_hours(n),
        (Some(n), 'd') => chrono::Duration::try_days(n),
        _ => None,
    };
    match age {
        Some(age) if age >= chrono::Duration::zero() => Ok(chrono::Utc::now() - age),
        _ => Err(format!(
            "{s:?} is not a time: give RFC 3339 (2026-11-30T12:00:00Z), a date (2026-11-30) \
             or an age (90m, 2h, 1d)"
        )),
    }
}

#[derive(Subcommand)]
enum RuleCmd {
    /// Create a rule, or update the one with that name.
    Add {
        #[arg(long)]
        name: String,
        #[arg(long)]
        connection: String,
        /// Path under the connection's base URL.
        #[arg(long, default_value = "")]
        path: String,
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..=10_000))]
        batch_size: Option<i32>,
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..=1000))]
        max_attempts: Option<i32>,
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..))]
        backoff_base_ms: Option<i32>,
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..))]
        backoff_max_ms: Option<i32>,
        /// Create it disabled.
        #[arg(long)]
        disabled: bool,
        /// Its share of the connection's budget against other busy rules (default 1).
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..=1000))]
        weight: Option<i32>,
    },
    /// List rules.
    List,
    /// Let the dispatcher start runs for a rule.
    Enable { name: String },
    /// Stop starting runs for a rule.
    Disable { name: String },
    /// Start no run for the rule; a run under way stops at its next batch, its backlog
    /// kept. Survives restarts.
    Pause { name: String },
    /// Let the rule run again (its backlog is dispatched at once).
    Resume { name: String },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("courier: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    // An invalid filter is refused like any other invalid setting, not replaced by the
    // default without a word.
    let filter = match tracing_subscriber::EnvFilter::try_new(&settings.log_filter) {
        Ok(filter) => filter,
        Err(e) => {
            let e = config::ConfigError {
                name: "COURIER_LOG".into(),
                value: settings.log_filter.clone(),
                reason: format!("not a log filter ({e}); e.g. info or info,courier=debug"),
            };
            eprintln!("courier: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    // Colour only on a terminal: log files and pipes get plain text (or JSON lines).
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(courier_cli::progress::LogWriter);
    match settings.log_format {
        config::LogFormat::Json => subscriber.json().init(),
        config::LogFormat::Text => subscriber
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    // A mistyped variable would be ignored silently: say so, with the nearest known name.
    let names = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok());
    for warning in config::unknown_variables(names) {
        tracing::warn!("{warning}");
    }
    match run(Cli::parse(), settings).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("courier: {}", describe(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each said once; a database error by PostgreSQL's
/// own message (not sqlx's rendering, which repeats it with the server's source line).
fn describe(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let (text, last) = match cause.downcast_ref::<sqlx::Error>() {
            Some(sqlx::Error::Database(db)) => (db.message().to_owned(), true),
            _ => match cause.downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                Some(db) => (db.message().to_owned(), true),
                None => (cause.to_string(), false),
            },
        };
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        if last {
            break;
        }
    }
    parts.join(": ")
}

async fn run(cli: Cli, settings: Settings) -> anyhow::Result<()> {
    let pool_settings = settings.pool();
    let connect = || db::connect_with(&settings.database_url, &pool_settings);
    // Commands that read or write courier's tables need them all: say so in one line.
    let pool = || async {
        let pool = connect().await?;
        db::ensure_migrated(&pool).await?;
        Ok::<_, db::DbError>(pool)
    };
    match cli.command {
        Command::Db(DbCmd::Create) => {
            let url = config::redact_url(&settings.database_url);
            if db::create_database_within(&settings.database_url, settings.db_connect_timeout)
                .await?
            {
                println!("database created: {url}");
            } else {
                println!("database exists already: {url}");
            }
        }
        Command::Migrate => {
            db::migrate(&connect().await?).await?;
            println!("migrations applied");
        }
        Command::Worker => {
            let pool = connect().await?;
            db::migrate(&pool).await?;
            let engine = Arc::new(Engine::new(pool, settings));
            let server = match engine.settings.http_addr {
                config::HttpAddr::Default => Some(web::start_default(engine.clone()).await?),
                config::HttpAddr::Set(addr) => Some(web::start(engine.clone(), addr).await?),
                config::HttpAddr::Off => None,
            };
            if let Some(server) = &server {
                // Recorded in this process's `workers` row by its first beat.
                let _ = engine.http_addr.set(server.addr);
                tracing::info!(addr = %server.addr, "serving /metrics and the dashboard");
            }
            worker::cancel_on_signal(engine.shutdown.clone());
            worker::run(engine).await?;
            if let Some(server) = server {
                let _ = server.task.await;
            }
        }
        Command::Enqueue { rule, file } => {
            let mut input = String::new();
            match file {
                Some(path) => {
                    input = std::fs::read_to_string(&path)
                        .with_context(|| format!("reading {}", path.display()))?
                }
                None => {
                    std::io::stdin().read_to_string(&mut input)?;
                }
            }
            let deliveries = enqueue::parse_ndjson(&input)?;
            let n = deliveries.len();
            enqueue::enqueue_many(&pool().await?, &rule, deliveries).await?;
            println!("enqueued {n} deliveries for rule {rule}");
        }
        Command::Apply {
            file,
            dry_run,
            replace,
        } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let opts = catalog::ApplyOptions { replace, dry_run };
            let changes = catalog::apply_file(&pool().await?, &text, opts)
                .await
                .with_context(|| format!("{}: nothing was applied", file.display()))?;
            for change in &changes {
                println!("{change}");
            }
            if dry_run {
                println!("dry run: nothing was saved");
            }
        }
        Command::Connection(ConnectionCmd::Add {
            name,
            writer,
            base_url,
            api_key_env,
            headers,
            requests_per_minute,
            max_in_flight,
            timeout_ms,
            budget_key,
        }) => {
            let mut map = serde_json::Map::new();
            for (i, h) in headers.iter().enumerate() {
                // Never echo the text: it may be a secret given without its name.
                let (k, v) = h.split_once(':').with_context(|| {
                    format!(
                        "connection {name:?}: --header number {} is not `Name: value` (no colon)",
                        i + 1
                    )
                })?;
                map.insert(k.trim().to_owned(), v.trim().into());
            }
            let id = catalog::upsert_connection(
                &pool().await?,
                &NewConnection {
                    name,
                    writer,
                    base_url,
                    api_key_env,
                    headers: map,
                    requests_per_minute,
                    max_in_flight,
                    timeout_ms,
                    budget_key,
                },
            )
            .await?;
            println!("connection {id} saved");
        }
        Command::Connection(ConnectionCmd::List) => {
            let rows = catalog::list_connections(&pool().await?).await?;
            print!(
                "{}",
                status::table(
                    &[
                        "id",
                        "name",
                        "writer",
                        "base url",
                        "key env",
                        "rate/min",
                        "in flight",
                        "timeout ms",
                        "budget",
                        "headers"
                    ],
                    &rows
                        .iter()
                        .map(|c| vec![
                            c.id.to_string(),
                            c.name.clone(),
                            c.writer.clone(),
                            c.base_url.clone(),
                            c.api_key_env.clone().unwrap_or_else(|| "-".into()),
                            c.requests_per_minute
                                .map_or("default".into(), |r| r.to_string()),
                            c.max_in_flight.to_string(),
                            c.timeout_ms.to_string(),
                            c.budget_key.clone(),
                            // Names only: a header's value may be a secret.
                            c.headers
                                .as_object()
                                .filter(|h| !h.is_empty())
                                .map_or("-".into(), |h| {
                                    h.keys().cloned().collect::<Vec<_>>().join(", ")
                                }),
                        ])
                        .collect::<Vec<_>>()
                )
            );
        }
        Command::Rule(RuleCmd::Add {
            name,
            connection,
            path,
            batch_size,
            max_attempts,
            backoff_base_ms,
            backoff_max_ms,
            disabled,
            weight,
        }) => {
            let id = catalog::upsert_rule(
                &pool().await?,
                &NewRule {
                    name,
                    connection,
                    path,
                    batch_size,
                    max_attempts,
                    backoff_base_ms,
                    backoff_max_ms,
                    enabled: Some(!disabled),
                    weight,
                },
            )
            .await?;
            println!("rule {id} saved");
        }
        Command::Rule(RuleCmd::List) => {
            let rows = catalog::list_rules(&pool().await?).await?;
            print!(
                "{}",
                status::table(
                    &[
                        "id",
                        "name",
                        "connection",
                        "path",
                        "enabled",
                        "batch",
                        "attempts"
                    ],
                    &rows
                        .iter()
                        .map(|r| vec![
                            r.id.to_string(),
                            r.name.clone(),
                            r.connection_id.to_string(),
                            r.path.clone(),
                            r.enabled.to_string(),
                            r.batch_size.to_string(),
                            r.max_attempts.to_string(),
                        ])
                        .collect::<Vec<_>>()
                )
            );
        }
        Command::Rule(RuleCmd::Enable { name }) => {
            catalog::set_rule_enabled(&pool().await?, &name, true).await?;
            println!("rule {name} enabled");
        }
        Command::Rule(RuleCmd::Disable { name }) => {
            catalog::set_rule_enabled(&pool().await?, &name, false).await?;
            println!("rule {name} disabled");
        }
        Command::Rule(RuleCmd::Pause { name }) => {
            let changed = ops::set_rule_paused(&pool().await?, &name, true).await?;
            println!("rule {name}: {changed}");
        }
        Command::Rule(RuleCmd::Resume { name }) => {
            let changed = ops::set_rule_paused(&pool().await?, &name, false).await?;
            println!("rule {name}: {changed}");
        }
        Command::Connection(ConnectionCmd::Pause { name }) => {
            let changed = ops::set_connection_paused(&pool().await?, &name, true).await?;
            println!("connection {name}: {changed}");
        }
        Command::Connection(ConnectionCmd::Resume { name }) => {
            let changed = ops::set_connection_paused(&pool().await?, &name, false).await?;
            println!("connection {name}: {changed}");
        }
        Command::Connection(ConnectionCmd::Unblock { name }) => {
            match ops::unblock_connection(&pool().await?, &name).await? {
                0 => println!("connection {name}: not blocked, nothing to lift"),
                n => println!("connection {name}: {n} block lifted; its rules may call now"),
            }
        }
        Command::Retry {
            rule,
            outcomes,
            since,
        } => {
            let outcomes: Vec<Outcome> = if outcomes.is_empty() {
                vec![Outcome::Exhausted]
            } else {
                outcomes
                    .iter()
                    .map(|o| match o {
                        RetryOutcome::Exhausted => Outcome::Exhausted,
                        RetryOutcome::Rejected => Outcome::Rejected,
                    })
                    .collect()
            };
            let n = ops::retry(&pool().await?, &rule, &outcomes, since).await?;
            let which: Vec<&str> = outcomes.iter().map(|o| o.as_str()).collect();
            let since = since.map_or(String::new(), |t| {
                format!(" ended since {}", t.format("%Y-%m-%d %H:%M:%S UTC"))
            });
            println!(
                "rule {rule}: {n} {} deliver{}{since} made pending again",
                which.join(" or "),
                if n == 1 { "y" } else { "ies" }
            );
        }
        Command::History { key, json } => {
            let entries = ops::history(&pool().await?, &key).await?;
            anyhow::ensure!(
                !entries.is_empty(),
                "no delivery has record key {key:?} (never enqueued, or removed by retention)"
            );
            if json {
                println!("{}", serde_json::to_string_pretty(&entries)?);
            } else {
                print!(
                    "{}",
                    status::table(
                        &[
                            "at", "rule", "delivery", "event", "run", "attempt", "http", "now",
                            "detail"
                        ],
                        &entries
                            .iter()
                            .map(|e| vec![
                                e.at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
                                e.rule.clone(),
                                e.delivery_id.to_string(),
                                e.outcome.map_or("enqueued", |o| o.as_str()).to_owned(),
                                e.run_id.map_or("-".into(), |r| r.to_string()),
                                e.attempt.map_or("-".into(), |a| a.to_string()),
                                e.http_status.map_or("-".into(), |h| h.to_string()),
                                e.status.as_str().to_owned(),
                                e.detail.clone().unwrap_or_else(|| "-".into()),
                            ])
                            .collect::<Vec<_>>()
                    )
                );
            }
        }
        Command::Status { json } => {
            let report = status::report_with(
                &pool().await?,
                chrono::Utc::now(),
                settings.worker_dead_after,
            )
            .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
        }
        Command::Bench {
            scenario,
            records,
            workers,
            kills,
            outage_seconds,
            skip_apalis_poison,
            seed,
            phases,
            limiters,
            ratios,
            out,
            database,
        } => {
            anyhow::ensure!(
                !database.is_empty()
                    && database
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "--database must be lowercase letters, digits and _ only, not {database:?}"
            );
            let report = bench::run(
                scenario,
                bench::BenchConfig {
                    server_url: settings.database_url.clone(),
                    database,
                    records,
                    workers,
                    out_dir: Some(out),
                    settings,
                    chaos: bench::ChaosKnobs {
                        kills,
                        outage: outage_seconds.map(std::time::Duration::from_secs),
                        skip_apalis_poison,
                        seed,
                        phases,
                    },
                    limits: bench::LimitsKnobs { limiters, ratios },
                },
            )
            .await?;
            print!("{}", report.render());
        }
        Command::Demo { records, rate } => {
            demo::run(settings, demo::DemoOptions { records, rate }).await?;
        }
        Command::Target(args) => {
            for (name, share) in [
                ("--fault-5xx", args.fault_5xx),
                ("--hang", args.hang),
                ("--reset", args.reset),
            ] {
                anyhow::ensure!(
                    (0.0..=1.0).contains(&share),
                    "{name} must be between 0 and 1"
                );
            }
            anyhow::ensure!(args.burst != Some(0), "--burst must be at least 1");
            let limit_schedule = match &args.limit_schedule {
                None => Vec::new(),
                Some(s) => target::parse_limit_schedule(s)
                    .map_err(|e| anyhow::anyhow!("--limit-schedule: {e}"))?,
            };
            let names: Vec<String> = args.workspaces.iter().map(|w| w.name.clone()).collect();
            let config = target::TargetConfig {
                bind: args.bind,
                port: args.port,
                workspaces: args.workspaces,
                rate: args.rate.max(1),
                window: args.window,
                burst: args.burst,
                limit_schedule,
                rate_headers: args.rate_headers,
                retry_after: args.retry_after,
                faults: target::Faults {
                    share_5xx: args.fault_5xx,
                    latency: args.latency_ms,
                    hang_share: args.hang,
                    reset_share: args.reset,
                    ..target::Faults::default()
                },
                ..target::TargetConfig::default()
            };
            let target = target::Target::start_with(config).await?;
            println!("courier target listening on {}", target.url());
            for name in names {
                println!("  workspace {name}: {}", target.workspace_url(&name));
            }
            println!("  counters: {}_counters", target.url());
            tokio::signal::ctrl_c().await?;
        }
    }
    Ok(())
}
