//! `courier db create`, `courier migrate`, `courier worker` and `courier demo`: the
//! database, and running the engine.

use std::sync::Arc;

use clap::Subcommand;
use courier::{
    config, db,
    worker::{self, Engine},
};
use courier_cli::{demo, web};

use super::Ctx;

#[derive(Subcommand)]
pub enum DbCmd {
    /// Create the database DATABASE_URL names, unless it exists (connects to the server's
    /// `postgres` database for that; the role needs CREATEDB). No other command creates
    /// it or connects anywhere but DATABASE_URL.
    Create,
}

/// `courier demo`'s arguments.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Deliveries to enqueue (customers, consents and price changes).
    #[arg(long, default_value_t = demo::DEFAULT_RECORDS)]
    records: usize,
    /// The target workspace's limit in requests per second (declared as 60x per minute).
    #[arg(long, default_value_t = demo::DEFAULT_RATE)]
    rate: u32,
}

/// Runs `courier db create`.
pub async fn db(ctx: &Ctx, cmd: DbCmd) -> anyhow::Result<()> {
    match cmd {
        DbCmd::Create => {
            let s = &ctx.settings;
            let url = config::redact_url(&s.database_url);
            if db::create_database_within(&s.database_url, s.db_connect_timeout).await? {
                println!("database created: {url}");
            } else {
                println!("database exists already: {url}");
            }
        }
    }
    Ok(())
}

/// Runs `courier migrate`.
pub async fn migrate(ctx: &Ctx) -> anyhow::Result<()> {
    db::migrate(&ctx.connect().await?).await?;
    println!("migrations applied");
    Ok(())
}

/// Runs `courier worker` until SIGTERM or Ctrl-C, serving metrics and the dashboard when
/// `COURIER_HTTP_ADDR` names an address.
pub async fn run(ctx: Ctx) -> anyhow::Result<()> {
    let pool = ctx.connect().await?;
    db::migrate(&pool).await?;
    let engine = Arc::new(Engine::new(pool, ctx.settings));
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
    Ok(())
}

/// Runs `courier demo`.
pub async fn demo(ctx: Ctx, args: DemoArgs) -> anyhow::Result<()> {
    let opts = demo::DemoOptions {
        records: args.records,
        rate: args.rate,
    };
    demo::run(ctx.settings, opts).await
}
