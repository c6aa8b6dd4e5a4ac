//! `courier target`: the local User.com-like HTTP target, until Ctrl-C.

use courier_target::{self as target, WorkspaceConfig};

/// Options of `courier target`.
#[derive(clap::Args)]
pub struct TargetArgs {
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
    /// RateLimit), x-ratelimit (reset in seconds), x-ratelimit-epoch, or the name of an
    /// emulation file stating its vendor's own (`rate_headers` in
    /// presets/<name>.target.json: hubspot, brevo).
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
    /// Limits of the paths a pattern matches outside the workspaces, fixed windows,
    /// PATTERN=LIMIT[,LIMIT] (repeatable): `**/events=350/s,3500/min` is Klaviyo's events
    /// endpoint. Answered 429 with Retry-After when spent.
    #[arg(long = "path-limit", value_parser = target::PathLimit::parse)]
    path_limits: Vec<target::PathLimit>,
}

/// Runs `courier target` until Ctrl-C.
pub async fn run(args: TargetArgs) -> anyhow::Result<()> {
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
        Some(s) => {
            target::parse_limit_schedule(s).map_err(|e| anyhow::anyhow!("--limit-schedule: {e}"))?
        }
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
        path_limits: args.path_limits,
        ..target::TargetConfig::default()
    };
    let target = target::Target::start_with(config).await?;
    println!("courier target listening on {}", target.url());
    for name in names {
        println!("  workspace {name}: {}", target.workspace_url(&name));
    }
    println!("  counters: {}_counters", target.url());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
