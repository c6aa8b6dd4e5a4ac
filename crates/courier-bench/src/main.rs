//! `courier-bench`: one benchmark scenario on a fresh database (on the server
//! `DATABASE_URL` names) with a local target, its table printed and its results written
//! (`<out>/<scenario>.json` and `.svg`). Build with `--release`; the scenarios that run
//! worker processes start the `courier` binary built beside this one.

use std::path::PathBuf;

use clap::Parser;
use courier::config::Settings;
use courier_bench as bench;
use courier_target as target;

/// Runs a benchmark scenario of courier on a fresh database with a local target.
#[derive(Parser)]
#[command(version, about)]
struct BenchArgs {
    /// pacing, throughput, latency, multi-worker, storm, idle-throttled, scale, limits,
    /// chaos, cold-start, soak, bulk, initial-sync or erasure.
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
    /// chaos: the phases to run, of kill, rolling, restart, outage, poison, apalis, skew
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
    /// limits: rules on the one connection, the records spread over them in turn (1); with
    /// several, every worker process calls at once.
    #[arg(long)]
    rules: Option<usize>,
    /// Where results go.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// The database the run drops and creates (another name lets two checkouts
    /// benchmark on one server at once).
    #[arg(long, default_value = "courier_bench")]
    database: String,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = BenchArgs::parse();
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("courier-bench: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match tracing_subscriber::EnvFilter::try_new(&settings.log_filter) {
        Ok(filter) => tracing_subscriber::fmt().with_env_filter(filter).init(),
        Err(e) => {
            eprintln!("courier-bench: COURIER_LOG {:?}: {e}", settings.log_filter);
            return std::process::ExitCode::from(2);
        }
    }
    match run(settings, args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("courier-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the scenario `args` names.
async fn run(settings: Settings, args: BenchArgs) -> anyhow::Result<()> {
    let BenchArgs {
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
        rules,
        out,
        database,
    } = args;
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
            limits: bench::LimitsKnobs {
                limiters,
                ratios,
                rules,
            },
        },
    )
    .await?;
    print!("{}", report.render());
    Ok(())
}
