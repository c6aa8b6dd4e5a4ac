//! Tables for people: the engine returns data ([`courier::status::Report`], the catalog's
//! rows, a record's history); this module lays it out in aligned columns for the command
//! line, and gives the dashboard the same cells.

use std::fmt::Write;

use chrono::{DateTime, Utc};
use courier::{
    jobs::JobLine,
    status::{
        BudgetStatus, ConnectionStatus, LimitUse, Problem, Report, RuleStatus, RunLine, WorkerLine,
    },
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

/// A budget's declared limits with their use: `10/s, 2/3 of 3/h` or, spent,
/// `3/h spent, frees 10:15:02` (`time` formats the moment).
pub fn limits_cell(limits: &[LimitUse], time: fn(Option<DateTime<Utc>>) -> String) -> String {
    limits
        .iter()
        .map(|l| match (l.used, l.spent) {
            (_, true) => format!("{} spent, frees {}", l.limit, time(l.frees_at)),
            (Some(used), false) => format!("{used}/{} of {}", l.quota, l.limit),
            (None, false) => l.limit.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A duration (a backlog's drain time, a job's age): `45 s`, `12 min`, `3.5 h`.
pub fn drain(secs: Option<f64>) -> String {
    match secs {
        None => "-".into(),
        Some(s) if s < 120.0 => format!("{s:.0} s"),
        Some(s) if s < 7_200.0 => format!("{:.0} min", s / 60.0),
        Some(s) => format!("{:.1} h", s / 3_600.0),
    }
}

/// The columns of a rule's line in `courier status` and on the dashboard.
pub const RULE_HEADERS: [&str; 14] = [
    "rule",
    "connection",
    "budget",
    "per call",
    "pending",
    "due",
    "on dep",
    "drain",
    "state",
    "until",
    "blocked by",
    "in jobs",
    "delivered",
    "last run",
];

/// A rule's cells under [`RULE_HEADERS`], `time` formatting the "until" column. Its state
/// says whether it is disabled or paused (by itself or its connection).
pub fn rule_cells(r: &RuleStatus, time: fn(Option<DateTime<Utc>>) -> String) -> Vec<String> {
    vec![
        r.name.clone(),
        r.connection.clone(),
        r.budget_key.clone(),
        r.records_per_call.to_string(),
        r.pending.to_string(),
        r.due.to_string(),
        r.waiting_on_dependency.to_string(),
        drain(r.drain_secs),
        match &r.paused {
            Some(by) if r.state == "paused" => format!("paused ({by})"),
            _ => r.state.clone(),
        },
        time(r.resume_at.or(r.blocked_until)),
        r.blocked_by_rule.clone().unwrap_or_else(|| "-".into()),
        in_jobs(r),
        r.totals.delivered.to_string(),
        match (&r.last_run, &r.last_run_status) {
            (Some(id), Some(s)) => format!("#{id} {s}"),
            _ => "-".into(),
        },
    ]
}

/// What a rule has in the target's jobs: `40000 accepted in 4 jobs`, or `-`.
pub fn in_jobs(r: &RuleStatus) -> String {
    match r.jobs_in_flight {
        0 => "-".into(),
        1 => format!("{} accepted in 1 job", r.accepted),
        n => format!("{} accepted in {n} jobs", r.accepted),
    }
}

/// A run's counters as cells: delivered, accepted (handed to the target's jobs), failed,
/// exhausted, rejected, suppressed, held (the order of `courier status` and the dashboard).
pub fn run_counts(r: &RunLine) -> [String; 7] {
    [
        r.delivered,
        r.accepted,
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
    out += "\nBUDGETS (each paced on its own: a connection's, a rule's own, a job's polls')\n";
    out += &budgets(&report.budgets);
    out += "\nRULES\n";
    let rules: Vec<Vec<String>> = report.rules.iter().map(|r| rule_cells(r, time)).collect();
    out += &table(&RULE_HEADERS, &rules);
    if !report.problems.is_empty() {
        out += "\nPROBLEMS (left alone until changed or the time given)\n";
        out += &problems(&report.problems);
    }
    if !report.jobs_in_flight.is_empty() {
        out += "\nJOBS IN FLIGHT (the target's: their records accepted, outcomes pending)\n";
        let rows: Vec<Vec<String>> = report
            .jobs_in_flight
            .iter()
            .map(|j| job_cells(j, time))
            .collect();
        out += &table(&JOB_HEADERS, &rows);
    }
    if !report.jobs_ended.is_empty() {
        out += "\nJOBS ENDED LATELY\n";
        let rows: Vec<Vec<String>> = report
            .jobs_ended
            .iter()
            .map(|j| ended_job_cells(j, time))
            .collect();
        out += &table(&ENDED_JOB_HEADERS, &rows);
    }
    if !report.erasures.is_empty() {
        out += "\nERASURES OPEN (each connection's target: told, or what it waits for)\n";
        let rows: Vec<Vec<String>> = report
            .erasures
            .iter()
            .map(|e| erasure_cells(e, time))
            .collect();
        out += &table(&ERASURE_HEADERS, &rows);
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
                c.circuit.clone(),
                time(c.open_until),
                c.consecutive_failures.to_string(),
                if c.paused { "yes" } else { "-" }.into(),
            ]
        })
        .collect();
    table(
        &[
            "name",
            "writer",
            "budget",
            "circuit",
            "open until",
            "failures",
            "paused",
        ],
        &rows,
    )
}

/// The headers of [`budget_cells`].
pub const BUDGET_HEADERS: [&str; 13] = [
    "budget",
    "connection",
    "kind",
    "limits",
    "learned",
    "advertised",
    "pace/min",
    "used/min",
    "last 429",
    "blocked until",
    "by rule",
    "why",
    "rules",
];

/// A budget's cells under [`BUDGET_HEADERS`].
pub fn budget_cells(b: &BudgetStatus, time: fn(Option<DateTime<Utc>>) -> String) -> Vec<String> {
    vec![
        b.key.clone(),
        b.connection.clone(),
        b.kind.to_owned(),
        limits_cell(&b.limits, time),
        rate(b.learned_rpm),
        rate(b.advertised_rpm),
        format!("{:.0}", b.effective_rpm),
        b.used_last_minute.to_string(),
        time(b.last_429_at),
        time(b.blocked_until),
        b.blocked_by.clone().unwrap_or_else(|| "-".into()),
        b.block_reason.clone().unwrap_or_else(|| "-".into()),
        match b.rules.is_empty() {
            true => "-".into(),
            false => b.rules.join(", "),
        },
    ]
}

fn budgets(budgets: &[BudgetStatus]) -> String {
    let rows: Vec<Vec<String>> = budgets.iter().map(|b| budget_cells(b, time)).collect();
    table(&BUDGET_HEADERS, &rows)
}

/// A job in flight's cells under [`JOB_HEADERS`].
pub fn job_cells(j: &JobLine, time: fn(Option<DateTime<Utc>>) -> String) -> Vec<String> {
    vec![
        j.rule.clone(),
        j.target_id.clone(),
        j.records.to_string(),
        drain(Some(j.age_secs)),
        j.polls.to_string(),
        j.last_said.clone().unwrap_or_else(|| "-".into()),
        time(j.next_poll_at),
    ]
}

/// An open erasure's cells under [`ERASURE_HEADERS`]: each connection's part as `name:
/// outcome`, with what a pending one waits for or met last.
pub fn erasure_cells(
    e: &courier::erasure::store::Erasure,
    time: fn(Option<DateTime<Utc>>) -> String,
) -> Vec<String> {
    let parts: Vec<String> = e
        .targets
        .iter()
        .map(|t| match (&t.waiting_for, &t.error) {
            (Some(w), _) if t.outcome == "pending" => {
                format!("{}: {} ({w})", t.connection, t.outcome)
            }
            (_, Some(err)) if t.outcome == "pending" => {
                format!(
                    "{}: {} (attempt {}: {err})",
                    t.connection, t.outcome, t.attempts
                )
            }
            _ => format!("{}: {}", t.connection, t.outcome),
        })
        .collect();
    vec![
        e.id.to_string(),
        time(Some(e.asked_at)),
        drain(Some(e.age_seconds)),
        e.asked_by.clone(),
        parts.join("; "),
    ]
}

/// The headers of [`erasure_cells`].
pub const ERASURE_HEADERS: [&str; 5] = ["erasure", "asked", "age", "asked by", "targets"];

/// The headers of [`job_cells`].
pub const JOB_HEADERS: [&str; 7] = [
    "rule",
    "target's id",
    "records",
    "age",
    "polls",
    "target said",
    "next poll",
];

/// An ended job's cells under [`ENDED_JOB_HEADERS`].
pub fn ended_job_cells(j: &JobLine, time: fn(Option<DateTime<Utc>>) -> String) -> Vec<String> {
    vec![
        j.rule.clone(),
        j.target_id.clone(),
        j.status.clone(),
        j.records.to_string(),
        j.delivered.to_string(),
        j.rejected.to_string(),
        j.unconfirmed.to_string(),
        j.failed.to_string(),
        drain(Some(j.age_secs)),
        time(j.finished_at),
    ]
}

/// The headers of [`ended_job_cells`].
pub const ENDED_JOB_HEADERS: [&str; 10] = [
    "rule",
    "target's id",
    "outcome",
    "records",
    "delivered",
    "rejected",
    "unconfirmed",
    "sent again",
    "took",
    "ended",
];

fn problems(problems: &[Problem]) -> String {
    let rows: Vec<Vec<String>> = problems
        .iter()
        .map(|p| vec![p.what.clone(), time(Some(p.until)), p.reason.clone()])
        .collect();
    table(&["what", "until", "reason"], &rows)
}

/// The headers of [`run_cells`].
pub const RUN_HEADERS: [&str; 12] = [
    "run",
    "rule",
    "status",
    "delivered",
    "to jobs",
    "failed",
    "exhausted",
    "rejected",
    "suppressed",
    "held",
    "started",
    "finished",
];

/// A run's cells under [`RUN_HEADERS`].
pub fn run_cells(r: &RunLine, time: fn(Option<DateTime<Utc>>) -> String) -> Vec<String> {
    let mut row = vec![format!("#{}", r.id), r.rule.clone(), r.status.clone()];
    row.extend(run_counts(r));
    row.extend([time(Some(r.started_at)), time(r.finished_at)]);
    row
}

fn runs(runs: &[RunLine]) -> String {
    let rows: Vec<Vec<String>> = runs.iter().map(|r| run_cells(r, time)).collect();
    table(&RUN_HEADERS, &rows)
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
