//! `courier connection ...`, `courier rule ...` and `courier apply`: the catalog of target
//! connections and rules.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use courier::{
    apply,
    catalog::{self, Connection, NewConnection, NewRule, Rule},
    ops,
    ratelimit::limits::Limit,
};
use courier_cli::tables::table;

use super::Ctx;

/// `courier connection add`.
#[derive(clap::Args)]
pub struct ConnectionAdd {
    #[arg(long)]
    pub name: String,
    /// Start from a ready target's connection (`courier preset list`): what else is given
    /// here goes over it.
    #[arg(long)]
    pub preset: Option<String>,
    /// Writer kind.
    #[arg(long, default_value = "http_json")]
    pub writer: String,
    #[arg(long, required_unless_present = "preset")]
    pub base_url: Option<String>,
    /// Environment variable holding the API key.
    #[arg(long)]
    pub api_key_env: Option<String>,
    /// How the key is presented, as JSON (default: a bearer token):
    /// `{"kind": "header", "name": "api-key"}`, `{"kind": "basic", "user": "anystring"}`.
    #[arg(long, value_name = "JSON", value_parser = parse_json_object)]
    pub auth: Option<serde_json::Value>,
    /// What the target says about its rate beyond the standard headers, as JSON
    /// (docs/catalog.md): `{"quotas": [{"limit": "X-Max", "window_seconds": 60,
    /// "remaining": "X-Left"}], "limited": [{"status": 403, "body_contains": "LIMIT"}]}`.
    #[arg(long, value_name = "JSON", value_parser = parse_json_object)]
    pub rate_signals: Option<serde_json::Value>,
    /// Extra header, `Name: value` (repeatable).
    #[arg(long = "header")]
    pub headers: Vec<String>,
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..))]
    pub requests_per_minute: Option<i32>,
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub max_in_flight: Option<i32>,
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..=600_000))]
    pub timeout_ms: Option<i32>,
    /// Share one budget and one rate-limit block with connections naming the same key
    /// (e.g. the workspace).
    #[arg(long)]
    pub budget_key: Option<String>,
    /// A limit the target states, `N/window` (window: s, 10s, min, h, day;
    /// repeatable): `--limit 10/s --limit 100000/day`. `--requests-per-minute N` is
    /// the one-limit shorthand `--limit N/min`.
    #[arg(long = "limit", value_parser = parse_limit)]
    pub limits: Vec<Limit>,
    /// Share of each window of a minute or longer kept for other clients, 0%–90%.
    #[arg(long, value_parser = parse_reserve)]
    pub reserve: Option<String>,
}

#[derive(Subcommand)]
pub enum ConnectionCmd {
    /// Create a connection, or update the one with that name.
    Add(Box<ConnectionAdd>),
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

/// `courier rule add`.
#[derive(clap::Args)]
pub struct RuleAdd {
    #[arg(long)]
    pub name: String,
    /// Start from a ready target's rule, `PRESET` (its first) or `PRESET/RULE`
    /// (`courier preset list`): what else is given here goes over it.
    #[arg(long, value_name = "PRESET[/RULE]")]
    pub preset: Option<String>,
    #[arg(long)]
    pub connection: String,
    /// Path under the connection's base URL.
    #[arg(long, default_value = "")]
    pub path: String,
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..=10_000))]
    pub batch_size: Option<i32>,
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub max_attempts: Option<i32>,
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..))]
    pub backoff_base_ms: Option<i32>,
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..))]
    pub backoff_max_ms: Option<i32>,
    /// Create it disabled.
    #[arg(long)]
    pub disabled: bool,
    /// Its share of the connection's budget against other busy rules (default 1).
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub weight: Option<i32>,
    /// The most deliveries one call carries (default 1), up to what the writer allows
    /// (http_json: 1000).
    #[arg(long, allow_negative_numbers = true)]
    pub records_per_call: Option<i32>,
    /// Spend from a budget of its own (an endpoint the target limits apart) instead of
    /// its connection's; its 429s block that budget only.
    #[arg(long, value_name = "K")]
    pub budget_key: Option<String>,
    /// Its own budget's limits, as the vendor states them for its endpoint (with
    /// `--budget-key`; repeatable): `--limit 75/s --limit 750/min`.
    #[arg(long = "limit", value_parser = parse_limit)]
    pub limits: Vec<Limit>,
    /// http_json: how the target's answers name each record's fate, as JSON
    /// (`{"kind": "keyed", "errors": "/errors", ...}`; docs/enqueue-and-ledger.md).
    #[arg(long, value_name = "JSON", value_parser = parse_json_object)]
    pub answer: Option<serde_json::Value>,
    /// http_json: how its requests are shaped, as JSON (`{"method": "PATCH", "item":
    /// {...}, "body": {"inputs": "{{records}}"}}`; docs/catalog.md).
    #[arg(long, value_name = "JSON", value_parser = parse_json_object)]
    pub request: Option<serde_json::Value>,
    /// http_json: deliver through the target's asynchronous jobs, as JSON (`{"id":
    /// "/data/id", "poll": {...}, "errors": {...}}`; docs/catalog.md, "Asynchronous jobs").
    #[arg(long, value_name = "JSON", value_parser = parse_json_object)]
    pub job: Option<serde_json::Value>,
}

#[derive(Subcommand)]
pub enum RuleCmd {
    /// Create a rule, or update the one with that name.
    Add(Box<RuleAdd>),
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

/// `courier apply`'s arguments.
#[derive(clap::Args)]
pub struct ApplyArgs {
    /// `{"connections": [...], "rules": [...]}`
    #[arg(required_unless_present = "preset")]
    file: Option<PathBuf>,
    /// Apply a ready target's catalog as it is (`courier preset show NAME` prints it).
    #[arg(long, conflicts_with = "file")]
    preset: Option<String>,
    /// Check the file and print the changes without saving anything.
    #[arg(long)]
    dry_run: bool,
    /// Fields the file leaves out take their defaults instead of their stored values.
    #[arg(long)]
    replace: bool,
}

/// A `--limit` value, refused with the reason.
fn parse_limit(s: &str) -> Result<Limit, String> {
    s.parse()
        .map_err(|e: courier::ratelimit::limits::LimitError| e.to_string())
}

/// A `--reserve` value (`10%`), refused with the reason.
fn parse_reserve(s: &str) -> Result<String, String> {
    courier::ratelimit::limits::parse_reserve(s)
        .map(|r| format!("{r}%"))
        .map_err(|e| e.to_string())
}

/// An `--answer` value: a JSON object (what it says is checked when the rule is saved).
fn parse_json_object(s: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str(s) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        Ok(_) => Err("expected a JSON object".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// Runs a `courier connection` subcommand.
pub async fn connection(ctx: &Ctx, cmd: ConnectionCmd) -> anyhow::Result<()> {
    match cmd {
        ConnectionCmd::Add(add) => {
            let ConnectionAdd {
                name,
                preset,
                writer,
                base_url,
                api_key_env,
                auth,
                rate_signals,
                headers,
                requests_per_minute,
                max_in_flight,
                timeout_ms,
                budget_key,
                limits,
                reserve,
            } = *add;
            let headers = header_map(&name, &headers)?;
            let given = serde_json::json!({
                "name": name, "writer": writer, "base_url": base_url, "api_key_env": api_key_env,
                "auth": auth, "headers": headers, "requests_per_minute": requests_per_minute,
                "max_in_flight": max_in_flight, "timeout_ms": timeout_ms,
                "budget_key": budget_key, "limits": limits, "reserve": reserve,
                "rate_signals": rate_signals,
            });
            let c: NewConnection = match preset {
                Some(p) => {
                    let preset = courier::presets::find(&p).map_err(anyhow::Error::msg)?;
                    serde_json::from_value(preset.connection(&given).into())?
                }
                None => serde_json::from_value(given)?,
            };
            let id = catalog::upsert_connection(&ctx.pool().await?, &c).await?;
            println!("connection {id} saved");
        }
        ConnectionCmd::List => {
            let rows = catalog::list_connections(&ctx.pool().await?).await?;
            print!("{}", connections_table(&rows));
        }
        ConnectionCmd::Pause { name } => {
            let changed = ops::set_connection_paused(&ctx.pool().await?, &name, true).await?;
            println!("connection {name}: {changed}");
        }
        ConnectionCmd::Resume { name } => {
            let changed = ops::set_connection_paused(&ctx.pool().await?, &name, false).await?;
            println!("connection {name}: {changed}");
        }
        ConnectionCmd::Unblock { name } => {
            match ops::unblock_connection(&ctx.pool().await?, &name).await? {
                0 => println!("connection {name}: not blocked, nothing to lift"),
                n => println!("connection {name}: {n} block lifted; its rules may call now"),
            }
        }
    }
    Ok(())
}

/// `--header Name: value` arguments as the connection's header map; an argument without a
/// colon is refused by its position, never echoed (it may be a secret given without its
/// name).
fn header_map(
    connection: &str,
    headers: &[String],
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let mut map = serde_json::Map::new();
    for (i, h) in headers.iter().enumerate() {
        let (k, v) = h.split_once(':').with_context(|| {
            format!(
                "connection {connection:?}: --header number {} is not `Name: value` (no colon)",
                i + 1
            )
        })?;
        map.insert(k.trim().to_owned(), v.trim().into());
    }
    Ok(map)
}

fn connections_table(rows: &[Connection]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|c| {
            vec![
                c.id.to_string(),
                c.name.clone(),
                c.writer.clone(),
                c.base_url.clone(),
                c.api_key_env.clone().unwrap_or_else(|| "-".into()),
                if c.limits.is_empty() {
                    c.requests_per_minute
                        .map_or("default".into(), |r| format!("{r}/min"))
                } else {
                    c.limits.join(" ")
                },
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
            ]
        })
        .collect();
    table(
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
            "headers",
        ],
        &cells,
    )
}

/// Runs a `courier rule` subcommand.
pub async fn rule(ctx: &Ctx, cmd: RuleCmd) -> anyhow::Result<()> {
    match cmd {
        RuleCmd::Add(add) => {
            let RuleAdd {
                name,
                preset,
                connection,
                path,
                batch_size,
                max_attempts,
                backoff_base_ms,
                backoff_max_ms,
                disabled,
                weight,
                records_per_call,
                budget_key,
                limits,
                answer,
                request,
                job,
            } = *add;
            let given = serde_json::json!({
                "name": name, "connection": connection,
                "path": (!path.is_empty()).then_some(path), "batch_size": batch_size,
                "max_attempts": max_attempts, "backoff_base_ms": backoff_base_ms,
                "backoff_max_ms": backoff_max_ms, "enabled": !disabled, "weight": weight,
                "records_per_call": records_per_call,
                "budget_key": budget_key, "limits": limits, "answer": answer,
                "request": request, "job": job,
            });
            let r: NewRule = match preset {
                Some(p) => {
                    let (p, rule) = match p.split_once('/') {
                        Some((p, rule)) => (p, Some(rule)),
                        None => (p.as_str(), None),
                    };
                    let preset = courier::presets::find(p).map_err(anyhow::Error::msg)?;
                    let entry = preset.rule(rule, &given).map_err(anyhow::Error::msg)?;
                    serde_json::from_value(entry.into())?
                }
                None => serde_json::from_value(given)?,
            };
            let id = catalog::upsert_rule(&ctx.pool().await?, &r).await?;
            println!("rule {id} saved");
        }
        RuleCmd::List => {
            let rows = catalog::list_rules(&ctx.pool().await?).await?;
            print!("{}", rules_table(&rows));
        }
        RuleCmd::Enable { name } => {
            catalog::set_rule_enabled(&ctx.pool().await?, &name, true).await?;
            println!("rule {name} enabled");
        }
        RuleCmd::Disable { name } => {
            catalog::set_rule_enabled(&ctx.pool().await?, &name, false).await?;
            println!("rule {name} disabled");
        }
        RuleCmd::Pause { name } => {
            let changed = ops::set_rule_paused(&ctx.pool().await?, &name, true).await?;
            println!("rule {name}: {changed}");
        }
        RuleCmd::Resume { name } => {
            let changed = ops::set_rule_paused(&ctx.pool().await?, &name, false).await?;
            println!("rule {name}: {changed}");
        }
    }
    Ok(())
}

fn rules_table(rows: &[Rule]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.id.to_string(),
                r.name.clone(),
                r.connection_id.to_string(),
                r.path.clone(),
                r.enabled.to_string(),
                r.batch_size.to_string(),
                r.records_per_call.to_string(),
                r.max_attempts.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "id",
            "name",
            "connection",
            "path",
            "enabled",
            "batch",
            "per call",
            "attempts",
        ],
        &cells,
    )
}

/// Runs `courier apply`.
pub async fn apply(ctx: &Ctx, args: ApplyArgs) -> anyhow::Result<()> {
    let ApplyArgs {
        file,
        preset,
        dry_run,
        replace,
    } = args;
    let (text, what) = match (file, preset) {
        (Some(file), _) => (
            std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?,
            file.display().to_string(),
        ),
        (None, Some(p)) => {
            let preset = courier::presets::find(&p).map_err(anyhow::Error::msg)?;
            (preset.text.to_owned(), format!("preset {p}"))
        }
        (None, None) => anyhow::bail!("name a file or --preset"),
    };
    let opts = apply::ApplyOptions { replace, dry_run };
    let changes = apply::apply_file(&ctx.pool().await?, &text, opts)
        .await
        .with_context(|| format!("{what}: nothing was applied"))?;
    if changes.is_empty() {
        println!("{what}: nothing to apply (it names no connection and no rule)");
    }
    for change in &changes {
        println!("{change}");
    }
    if dry_run {
        println!("dry run: nothing was saved");
    }
    Ok(())
}

/// `courier preset ...`.
#[derive(Subcommand)]
pub enum PresetCmd {
    /// The ready targets, a line each.
    List,
    /// Print one as a catalog file: apply it as it is (`courier apply --preset NAME`), or
    /// copy and change it for another target.
    Show { name: String },
}

/// Runs a `courier preset` subcommand.
pub fn preset(cmd: PresetCmd) -> anyhow::Result<()> {
    match cmd {
        PresetCmd::List => {
            let rows: Vec<Vec<String>> = courier::presets::PRESETS
                .iter()
                .map(|p| vec![p.name.to_owned(), p.rules().join(", "), p.about()])
                .collect();
            print!("{}", table(&["preset", "rules", "what it is"], &rows));
        }
        PresetCmd::Show { name } => {
            let preset = courier::presets::find(&name).map_err(anyhow::Error::msg)?;
            print!("{}", preset.text);
        }
    }
    Ok(())
}
