//! Tables for people: the engine returns data ([`courier::status::Report`], the catalog's
//! rows, a record's history); this module lays it out in aligned columns for the command
//! line, and gives the dashboard the same cells.

use std::fmt::Write;

use chrono::{DateTime, Utc};
use courier::status::{
    ConnectionStatus, JobsLine, Problem, Report, RuleStatus, RunLine, WorkerLine,
};

/// Renders rows as aligned columns under `headers`.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let parts: Vec<String> = cells
            .zip(&widths)
            // Padded by hand: a format width past u16::MAX panics, and a cell may be long.
            .map(|(c, w)| format!("{c}{}", " ".repeat(w.saturating_sub(c.chars().count()))))
            .collect();
        let _ = writeln!(out, "{}", parts.join("  ").trim_end());
    };
    line(&mut out, &mut headers.iter().copied());
    for row in rows {
        line(&mut out, &mut row.iter().map(String::as_str));
    }
    out
}

/// A time to the second, or `-`.
pub fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "-".into())
}

/// A rate per minute, or `-`.
fn rate(rpm: Option<f64>) -> String {
    rpm.map_or_else(|| "-".into(), |r| format!("{r:.0}"))
}

/// A connection's declared limits with their use: `10/s, 2/3 of 3/h` or, spent,
/// `3/h spent, frees 10:15:02` (`time` formats the moment).
pub fn limits_cell(c: &ConnectionStatus, time: fn(Option<DateTime<Utc>>) -> String) -> String {
    c.limits
        .iter()
        .map(|l| match (l.used, l.spent) {
            (_, true) => format!("{} spent, frees {}", l.limit, time(l.frees_at)),
            (Some(used), false) => format!("{used}/{} of {}", l.quota, l.limit),
            (None, false) => l.limit.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A backlog's estimated drain time: `45 s`, `12 min`, `3.5 h`.
pub fn drain(secs: Option<f64>) -> String {
    match secs {
        None => "-".into(),
        Some(s) if s < 120.0 => format!("{s:.0} s"),
        Some(s) if s < 7_200.0 => format!("{:.0} min", s / 60.0),
        Some(s) => format!("{:.1} h", s / 3_600.0),
    }
}

/// The columns of a rule's line in `courier status` and on the dashboard.
pub const RULE_HEADERS: [&str; 13] = [
    "rule",
    "connection",
    "per call",
    "enabled",
    "paused",
    "pending",
    "due",
    "on dep",
    "drain",
    "state",
    "until",
    "blocked by",
    "last run",
];

/// A rule's cells under [`RULE_HEADERS`], `time` formatting the "until" column.
pub fn rule_cells(r: &RuleStatus, time: fn(Option<DateTime<Utc>>) -> String) -> Vec<String> {
    vec![
        r.name.clone(),
        r.connection.clone(),
        r.records_per_call.to_string(),
        r.enabled.to_string(),
        r.paused.clone().unwrap_or_else(|| "-".into()),
        r.pending.to_string(),
        r.due.to_string(),
        r.waiting_on_dependency.to_string(),
        drain(r.drain_secs),
        r.state.clone(),
        time(r.resume_at.or(r.blocked_until)),
        r.blocked_by_rule.clone().unwrap_or_else(|| "-".into()),
        match (&r.last_run, &r.last_run_status) {
            (Some(id), Some(s)) => format!("#{id} {s}"),
            _ => "-".into(),
        },
    ]
}

/// A run's counters as cells: delivered, failed, exhausted, rejected, suppressed, held
/// (the order of `courier status` and the dashboard).
pub fn run_counts(r: &RunLine) -> [String; 6] {
    [
        r.delivered,
        r.failed,
        r.exhausted,
        r.rejected,
        r.suppressed,
        r.held,
    ]
    .map(|n| n.to_string())
}

/// `courier status` as tables: connections, rules, problems (if any), recent runs.
pub fn status(report: &Report) -> String {
    let mut out = String::from("CONNECTIONS\n");
    out += &connections(&report.connections);
    out += "\nRULES\n";
    let rules: Vec<Vec<String>> = report.rules.iter().map(|r| rule_cells(r, time)).collect();
    out += &table(&RULE_HEADERS, &rules);
    if !report.problems.is_empty() {
        out += "\nPROBLEMS (left alone until changed or the time given)\n";
        out += &problems(&report.problems);
    }
    if !report.jobs.is_empty() {
        out += "\nJOBS (the target's, in flight: their records accepted, outcomes pending)\n";
        out += &jobs(&report.jobs);
    }
    out += "\nWORKERS (live)\n";
    out += &workers(&report.workers);
    out += "\nRECENT RUNS\n";
    out += &runs(&report.recent_runs);
    out
}

fn workers(workers: &[WorkerLine]) -> String {
    let rows: Vec<Vec<String>> = workers
        .iter()
        .map(|w| {
            vec![
                w.name.clone(),
                time(Some(w.started_at)),
                time(Some(w.heartbeat_at)),
                w.clock_offset_ms
                    .map_or_else(|| "-".into(), |ms| format!("{:+.3} s", ms / 1000.0)),
                w.http_addr
                    .as_ref()
                    .map_or_else(|| "-".into(), |a| format!("http://{a}/")),
            ]
        })
        .collect();
    table(
        &[
            "name",
            "started",
            "last beat",
            "clock offset",
            "metrics and dashboard",
        ],
        &rows,
    )
}

fn connections(connections: &[ConnectionStatus]) -> String {
    let rows: Vec<Vec<String>> = connections
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                c.writer.clone(),
                c.budget_key.clone(),
                limits_cell(c, time),
                rate(c.learned_rpm),
                rate(c.advertised_rpm),
                format!("{:.0}", c.effective_rpm),
                c.used_last_minute.to_string(),
                c.circuit.clone(),
                time(c.open_until),
                c.consecutive_failures.to_string(),
                time(c.blocked_until),
                c.blocked_by.clone().unwrap_or_else(|| "-".into()),
                c.retry_after_raw.clone().unwrap_or_else(|| "-".into()),
                if c.paused { "yes" } else { "-" }.into(),
            ]
        })
        .collect();
    table(
        &[
            "name",
            "writer",
            "budget",
            "limits",
            "learned",
            "advertised",
            "pace/min",
            "used/min",
            "circuit",
            "open until",
            "failures",
            "blocked until",
            "by rule",
            "retry-after",
            "paused",
        ],
        &rows,
    )
}

/// The jobs in flight per rule, as cells (the order of `courier status` and the dashboard).
pub fn job_cells(j: &JobsLine, time: fn(Option<DateTime<Utc>>) -> String) -> Vec<String> {
    vec![
        j.rule.clone(),
        j.jobs.to_string(),
        j.records.to_string(),
        time(j.oldest),
        time(j.last_poll),
        j.last_said.clone().unwrap_or_else(|| "-".into()),
        j.overdue.to_string(),
    ]
}

/// The headers of [`job_cells`].
pub const JOB_HEADERS: [&str; 7] = [
    "rule",
    "jobs",
    "records",
    "oldest submitted",
    "last poll",
    "target said",
    "overdue",
];

fn jobs(jobs: &[JobsLine]) -> String {
    let rows: Vec<Vec<String>> = jobs.iter().map(|j| job_cells(j, time)).collect();
    table(&JOB_HEADERS, &rows)
}

fn problems(problems: &[Problem]) -> String {
    let rows: Vec<Vec<String>> = problems
        .iter()
        .map(|p| vec![p.what.clone(), time(Some(p.until)), p.reason.clone()])
        .collect();
    table(&["what", "until", "reason"], &rows)
}

fn runs(runs: &[RunLine]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let mut row = vec![r.id.to_string(), r.rule.clone(), r.status.clone()];
            row.extend(run_counts(r));
            row.extend([time(Some(r.started_at)), time(r.finished_at)]);
            row
        })
        .collect();
    table(
        &[
            "run", "rule", "status", "deliv", "fail", "exh", "rej", "supp", "held", "started",
            "finished",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_table_lays_out_cells_of_any_length() {
        let long = "x".repeat(1 << 20);
        let out = super::table(
            &["key", "error"],
            &[
                vec!["a".into(), long.clone()],
                vec!["bb".into(), "short".into()],
            ],
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "key  error");
        assert_eq!(lines[1], format!("a    {long}"));
        assert_eq!(lines[2], "bb   short");
    }
}
