//! The `courier` command line: parses arguments, loads and validates the settings, starts
//! telemetry, and dispatches to the subcommand's module in [`cmd`], which hands over to the
//! engine library (`courier`), the local target (`courier_target`) or this crate's demo.

mod cmd;

use clap::{Parser, Subcommand};
use courier::config::{self, Settings};

use cmd::{
    Ctx,
    catalog::{ApplyArgs, ConnectionCmd, PresetCmd, RuleCmd},
    deliveries::{EnqueueArgs, HistoryArgs, RetryArgs, StatusArgs},
    erase::EraseArgs,
    target::TargetArgs,
    worker::{DbCmd, DemoArgs},
};

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
    Enqueue(EnqueueArgs),
    /// Create or update connections and rules from a JSON file, all or nothing; prints what
    /// it created, changed and left alone. Fields the file leaves out keep their stored
    /// values.
    Apply(ApplyArgs),
    /// Manage target connections.
    #[command(subcommand)]
    Connection(ConnectionCmd),
    /// Manage rules.
    #[command(subcommand)]
    Rule(RuleCmd),
    /// Ready targets (HubSpot, Klaviyo, Brevo, Braze, Customer.io, Salesforce, Mailchimp, Keap):
    /// catalog files to apply, or to start a connection or rule from.
    #[command(subcommand)]
    Preset(PresetCmd),
    /// Make a rule's exhausted (or rejected) deliveries pending again, with their attempts
    /// reset; a delivery whose key has a newer one (in any state) is left alone.
    Retry(RetryArgs),
    /// Show one record key's deliveries and ledger rows, oldest first.
    History(HistoryArgs),
    /// Show connections, rules and recent runs.
    Status(StatusArgs),
    /// Forget a person in every target and in courier (GDPR art. 17): prints the erasure's
    /// id and what each connection's target will be told; `--lift` lets deliveries naming
    /// a person erased before go out again.
    Erase(EraseArgs),
    /// Run the end-to-end demo on a fresh `courier_demo` database with a local User.com target.
    Demo(DemoArgs),
    /// Run the local User.com-like HTTP target until Ctrl-C.
    Target(TargetArgs),
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // The arguments first: `--help` and a usage error need no valid settings.
    let cli = Cli::parse();
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
    match run(cli, settings).await {
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

/// Hands the parsed command to its module.
async fn run(cli: Cli, settings: Settings) -> anyhow::Result<()> {
    let ctx = Ctx { settings };
    match cli.command {
        Command::Migrate => cmd::worker::migrate(&ctx).await,
        Command::Db(c) => cmd::worker::db(&ctx, c).await,
        Command::Worker => cmd::worker::run(ctx).await,
        Command::Enqueue(a) => cmd::deliveries::enqueue(&ctx, a).await,
        Command::Apply(a) => cmd::catalog::apply(&ctx, a).await,
        Command::Connection(c) => cmd::catalog::connection(&ctx, c).await,
        Command::Rule(c) => cmd::catalog::rule(&ctx, c).await,
        Command::Preset(c) => cmd::catalog::preset(c),
        Command::Retry(a) => cmd::deliveries::retry(&ctx, a).await,
        Command::History(a) => cmd::deliveries::history(&ctx, a).await,
        Command::Status(a) => cmd::deliveries::status(&ctx, a).await,
        Command::Erase(a) => cmd::erase::erase(&ctx, a).await,
        Command::Demo(a) => cmd::worker::demo(ctx, a).await,
        Command::Target(a) => cmd::target::run(a).await,
    }
}
