//! `courier-bench limits`: how delivery meets real limiters. A matrix of the target's
//! limiter kind (fixed, sliding, gcra, token bucket) × declared ÷ real rate (1, 2, 5, 10,
//! and a limit that halves in the middle of the burst, as when another client starts on
//! the workspace) × worker processes (1 and 3); `--rules N` spreads each cell's records
//! over N rules on the connection, so that every process calls at once. Each cell runs on a fresh database of its
//! own and reports achieved ÷ real, the 429 share, the time to converge to ≥ 90% of the
//! real limit and drain ÷ ideal; each cell's plot draws the pace against the real limit,
//! and its JSON keeps the timeline the figures came from.

use std::time::{Duration, Instant};

use courier::enqueue;
use courier_target::{RetryAfterMode, Target, TargetConfig, Window, WorkspaceConfig};

use super::{BenchConfig, Report, Sample, Workers, fresh_database, watch};

/// The workspace's real limit before any drop, requests per second (User.com's).
pub const REAL_PER_SECOND: u32 = 10;
/// Records per cell unless told: 30 s at the real limit.
pub const DEFAULT_RECORDS: usize = 300;
/// The share of the ideal drain after which the mid-burst drop strikes.
const DROP_AFTER_SHARE: f64 = 0.3;
/// The share of the real limit that counts as converged.
const CONVERGED: f64 = 0.9;
/// Longest a cell may take to drain.
const CELL_LIMIT: Duration = Duration::from_secs(600);

/// How the declared rate relates to the real one in a cell.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ratio {
    /// Declared = this many times the real limit, which holds throughout.
    Times(u32),
    /// Declared = the real limit, which halves after [`DROP_AFTER_SHARE`] of the ideal drain.
    Drop,
}

impl Ratio {
    /// Every ratio the matrix runs.
    pub const ALL: [Ratio; 5] = [
        Ratio::Times(1),
        Ratio::Times(2),
        Ratio::Times(5),
        Ratio::Times(10),
        Ratio::Drop,
    ];

    fn label(self) -> String {
        match self {
            Ratio::Times(n) => format!("×{n}"),
            Ratio::Drop => "drop ½".into(),
        }
    }

    fn file_label(self) -> String {
        match self {
            Ratio::Times(n) => format!("x{n}"),
            Ratio::Drop => "drop".into(),
        }
    }
}

/// The real limit over time: `(from second, requests per second)` steps.
fn real_steps(ratio: Ratio, records: usize) -> Vec<(f64, f64)> {
    let real = f64::from(REAL_PER_SECOND);
    match ratio {
        Ratio::Times(_) => vec![(0.0, real)],
        Ratio::Drop => vec![
            (0.0, real),
            (records as f64 / real * DROP_AFTER_SHARE, real / 2.0),
        ],
    }
}

/// The real limit at second `t`.
fn real_at(steps: &[(f64, f64)], t: f64) -> f64 {
    steps
        .iter()
        .rev()
        .find(|(from, _)| *from <= t)
        .map_or(steps[0].1, |(_, r)| *r)
}

/// The shortest possible drain of `records` under `steps` (sent exactly at the limit).
pub fn ideal_drain(steps: &[(f64, f64)], records: usize) -> f64 {
    let mut left = records as f64;
    let mut t: f64 = 0.0;
    for (i, &(from, rate)) in steps.iter().enumerate() {
        t = t.max(from);
        let until = steps.get(i + 1).map_or(f64::INFINITY, |s| s.0);
        let can = (until - t) * rate;
        if can >= left {
            return t + left / rate;
        }
        left -= can;
        t = until;
    }
    t
}

/// What one cell measured.
#[derive(Clone, Debug, PartialEq)]
pub struct CellFigures {
    /// Accepted calls per second from the first call to the last, over the ideal average.
    pub achieved_over_real: f64,
    /// 429s among all calls.
    pub share_429: f64,
    /// Seconds from the first call (or the drop) until the budget's pace stays within
    /// 90–100% of the real limit with no 429 after; `None` when it never did before the
    /// backlog ran out.
    pub converge_s: Option<f64>,
    /// Seconds from the same start until the pace stays at or above 90% of the real limit
    /// (#9's words: "converges to ≥ 90% of the real limit"), 429s being counted apart, in
    /// `share_429`. Below `converge_s` when the pace sits over the limit a while: a token
    /// bucket's burst spent at a pace the target still accepts.
    pub reach_s: Option<f64>,
    /// Drain time over the ideal.
    pub drain_over_ideal: f64,
}

/// Computes a cell's figures from its samples (`t` since the workers started), the real
/// limit's steps on the same clock, the records, and the drain time.
pub fn cell_figures(
    samples: &[Sample],
    steps: &[(f64, f64)],
    records: usize,
    drain: f64,
) -> CellFigures {
    let accepted = |s: &Sample| s.requests.saturating_sub(s.throttled) as f64;
    let last = samples.last().copied().unwrap_or_default();
    let share_429 = if last.requests > 0 {
        last.throttled as f64 / last.requests as f64
    } else {
        0.0
    };
    let first_call = samples.iter().find(|s| s.requests > 0).map_or(0.0, |s| s.t);
    // The backlog ran out when the last accepted call came in.
    let done = samples
        .iter()
        .find(|s| accepted(s) >= accepted(&last))
        .map_or(last.t, |s| s.t);
    let ideal = ideal_drain(steps, records);
    // At least one sampling interval: a burst that drained between two samples has no
    // measurable span.
    let span = (done - first_call).max(super::SAMPLE_EVERY.as_secs_f64());
    let achieved_over_real = (accepted(&last) / span) / (records as f64 / ideal);
    // Converged from the first sample after which, until the backlog ran out, the
    // budget's pace stays between 90% and 100% of the real limit and no 429 comes: the
    // budget has found the limit. (The calls' own rate dips a call or two at batch edges,
    // which is throughput, in achieved ÷ real, not convergence.)
    let from = steps
        .last()
        .filter(|_| steps.len() > 1)
        .map_or(first_call, |s| s.0);
    let judged: Vec<&Sample> = samples.iter().filter(|s| s.t <= done).collect();
    let below = |s: &Sample| s.pace.is_none_or(|p| p < CONVERGED * real_at(steps, s.t));
    let unsettled = |s: &Sample| {
        s.throttled < last.throttled || below(s) || s.pace.is_some_and(|p| p > real_at(steps, s.t))
    };
    // From the first sample after the last one `off` holds for.
    let after_last = |off: &dyn Fn(&Sample) -> bool| match judged.iter().rposition(|s| off(s)) {
        None => Some(0.0),
        Some(i) => judged.get(i + 1).map(|s| (s.t - from).max(0.0)),
    };
    CellFigures {
        achieved_over_real,
        share_429,
        converge_s: after_last(&unsettled),
        reach_s: after_last(&below),
        drain_over_ideal: drain / ideal,
    }
}

/// Runs the matrix; `records` per cell, `processes` limits the process counts (`None`:
/// 1 and 3). Adds four figures per cell to `report`, gives it the timeline of the gcra
/// drop cell with one process (the plot of `limits.svg`) and writes each cell's plot.
pub(super) async fn run(
    report: &mut Report,
    config: &BenchConfig,
    records: usize,
) -> anyhow::Result<()> {
    let processes: Vec<usize> = match config.workers {
        Some(n) => vec![n.max(1)],
        None => vec![1, 3],
    };
    let cell_config = BenchConfig {
        database: format!("{}_cell", config.database),
        ..config.clone()
    };
    report.figure("records per cell", records as u64);
    report.figure("real limit (requests/s)", u64::from(REAL_PER_SECOND));
    let knobs = &config.limits;
    let rules = knobs.rules.unwrap_or(1).max(1);
    let rules_label = if rules > 1 {
        format!("-{rules}r")
    } else {
        String::new()
    };
    report.figure("rules on the connection", rules as u64);
    for (_, window) in Window::ALL {
        if knobs
            .limiters
            .as_ref()
            .is_some_and(|l| !l.contains(&window))
        {
            continue;
        }
        for ratio in Ratio::ALL {
            if knobs
                .ratios
                .as_ref()
                .is_some_and(|r| !r.contains(&ratio.file_label()))
            {
                continue;
            }
            for &n in &processes {
                let label = format!("{window} {} {n}p{rules_label}", ratio.label());
                let (figures, timeline, steps, declared) =
                    cell(&cell_config, window, ratio, n, rules, records).await?;
                let mut cell_report = Report::new(
                    &format!("limits-{window}-{}-{n}p{rules_label}", ratio.file_label()),
                    report.machine.clone(),
                );
                let seconds =
                    |s: Option<f64>| s.map_or_else(|| "never".into(), serde_json::Value::from);
                let (converge, reach) = (seconds(figures.converge_s), seconds(figures.reach_s));
                for (name, value) in [
                    ("achieved ÷ real", figures.achieved_over_real.into()),
                    ("429 share", figures.share_429.into()),
                    ("converge to 90% (s)", converge),
                    ("reach 90% (s)", reach),
                    ("drain ÷ ideal", figures.drain_over_ideal.into()),
                ] {
                    report.figure(&format!("{label}: {name}"), value.clone());
                    cell_report.figure(name, value);
                }
                cell_report.timeline = timeline;
                cell_report.declared_per_second = Some(declared);
                cell_report.real_limit = steps;
                if let Some(dir) = &config.out_dir {
                    cell_report.write(dir)?;
                }
                if window == Window::Gcra && ratio == Ratio::Drop && n == processes[0] {
                    report.timeline = cell_report.timeline;
                    report.declared_per_second = cell_report.declared_per_second;
                    report.real_limit = cell_report.real_limit;
                }
            }
        }
    }
    Ok(())
}

/// One cell on a fresh database: figures, timeline, the real limit's steps, the declared
/// rate per second.
async fn cell(
    config: &BenchConfig,
    window: Window,
    ratio: Ratio,
    processes: usize,
    rules: usize,
    records: usize,
) -> anyhow::Result<(CellFigures, Vec<Sample>, Vec<(f64, f64)>, f64)> {
    let (pool, url) = fresh_database(config).await?;
    let steps = real_steps(ratio, records);
    let declared = match ratio {
        Ratio::Times(n) => f64::from(REAL_PER_SECOND * n),
        Ratio::Drop => f64::from(REAL_PER_SECOND),
    };
    let target = Target::start_with(TargetConfig {
        workspaces: vec![WorkspaceConfig::new("bench", super::fixtures::TOKEN)],
        rate: REAL_PER_SECOND,
        period: Duration::from_secs(1),
        window,
        limit_schedule: steps
            .iter()
            .skip(1)
            .map(|&(from, rate)| (Duration::from_secs_f64(from), rate as u32))
            .collect(),
        retry_after: RetryAfterMode::Seconds,
        ..TargetConfig::default()
    })
    .await?;
    super::fixtures::customers_on_workspace(&pool, &target, (declared * 60.0) as i32, 16).await?;
    // The records in turn over the rules: `customers`, `customers-2`, ….
    let names: Vec<String> = (1..=rules)
        .map(|i| match i {
            1 => "customers".to_owned(),
            i => format!("customers-{i}"),
        })
        .collect();
    for name in &names[1..] {
        super::fixtures::rule(&pool, name, "workspace", "usercom-users", 100).await?;
    }
    let mut shares = vec![Vec::new(); rules];
    for (i, user) in super::fixtures::users("customer", records)
        .into_iter()
        .enumerate()
    {
        shares[i % rules].push(user);
    }
    for (name, share) in names.iter().zip(shares) {
        enqueue::enqueue_many(&pool, name, share).await?;
    }
    // The target's schedule counts from its start: start the clock with it.
    let started = Instant::now();
    let workers = if processes == 1 {
        Workers::in_process(&pool, &config.settings)
    } else {
        Workers::children(processes, &url, &config.settings)?
    };
    let timeline = watch(&pool, &target, started, CELL_LIMIT).await?;
    workers.stop().await?;
    let drain = timeline.last().map_or(0.0, |s| s.t);
    pool.close().await;
    Ok((
        cell_figures(&timeline, &steps, records, drain),
        timeline,
        steps,
        declared,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, requests: u64, throttled: u64, pace: f64) -> Sample {
        Sample {
            t,
            requests,
            throttled,
            delivered: 0,
            blocked: false,
            pace: Some(pace),
        }
    }

    #[test]
    fn the_ideal_drain_follows_the_steps() {
        assert_eq!(ideal_drain(&[(0.0, 10.0)], 300), 30.0);
        // 90 in the first 9 s at 10/s, the other 210 at 5/s: 42 s more.
        let steps = real_steps(Ratio::Drop, 300);
        assert_eq!(steps, vec![(0.0, 10.0), (9.0, 5.0)]);
        assert_eq!(ideal_drain(&steps, 300), 51.0);
        assert_eq!(ideal_drain(&steps, 50), 5.0);
        assert_eq!(real_at(&steps, 8.9), 10.0);
        assert_eq!(real_at(&steps, 9.0), 5.0);
    }

    #[test]
    fn figures_of_a_cell_that_converges_after_a_rough_start() {
        // One sample a second: 3 s at 5 accepted/s (10 sent, 5 refused), the budget's pace
        // at 20/s, then 10/s at a pace of 9.8/s.
        let mut samples = vec![sample(0.0, 0, 0, 20.0)];
        let (mut req, mut thr) = (0u64, 0u64);
        for t in 1..=14 {
            req += 10;
            if t <= 4 {
                thr += 5;
            }
            let pace = if t < 4 { 20.0 } else { 9.8 };
            samples.push(sample(f64::from(t), req, thr, pace));
        }
        let steps = [(0.0, 10.0)];
        // 20 + 100 accepted: the backlog was 120 records, ideally 12 s.
        let f = cell_figures(&samples, &steps, 120, 14.0);
        assert_eq!(f.share_429, 20.0 / 140.0);
        // From the first call (t = 1) to the first sample after the last 429 (t = 4).
        assert_eq!(f.converge_s, Some(3.0), "{f:?}");
        assert!(
            (f.achieved_over_real - 120.0 / 13.0 / 10.0).abs() < 1e-9,
            "{f:?}"
        );
        assert!((f.drain_over_ideal - 14.0 / 12.0).abs() < 1e-9, "{f:?}");
        // The pace reached 90% of the limit at t = 4 (20/s before); reaching it does not
        // wait for the last 429.
        assert_eq!(f.reach_s, Some(0.0), "{f:?}");
        // A pace under 90% of the limit, or over it, is not converged; over it has reached.
        for (pace, reach) in [(8.9, None), (10.1, Some(0.0))] {
            let off: Vec<Sample> = samples
                .iter()
                .map(|s| Sample {
                    pace: Some(if s.t >= 12.0 { pace } else { 9.8 }),
                    ..*s
                })
                .collect();
            let f = cell_figures(&off, &steps, 120, 14.0);
            assert_eq!((f.converge_s, f.reach_s), (None, reach), "{pace}");
        }
        // A pace that dips under 90% and comes back has reached it from its return.
        let dip: Vec<Sample> = samples
            .iter()
            .map(|s| Sample {
                pace: Some(if (5.0..7.0).contains(&s.t) { 4.9 } else { 9.8 }),
                ..*s
            })
            .collect();
        assert_eq!(cell_figures(&dip, &steps, 120, 14.0).reach_s, Some(6.0));
        // No 429 and the pace in the band throughout: converged from the start.
        let calm: Vec<Sample> = (0..=40)
            .map(|i| sample(f64::from(i) * 0.25, i as u64, 0, 9.8))
            .collect();
        assert_eq!(cell_figures(&calm, &steps, 10, 10.0).converge_s, Some(0.0));
    }
}
