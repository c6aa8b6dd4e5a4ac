//! `courier bench`: one benchmark scenario on a fresh database, its table printed and its
//! results written.

use std::path::PathBuf;

use courier_cli::bench;
use courier_target as target;

use super::Ctx;

/// `courier bench`'s arguments.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// pacing, throughput, latency, multi-worker, storm, idle-throttled, scale, limits,
    /// chaos, cold-start, soak or bulk.
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

/// Runs `courier bench`.
pub async fn run(ctx: Ctx, args: BenchArgs) -> anyhow::Result<()> {
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
    let settings = ctx.settings;
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
