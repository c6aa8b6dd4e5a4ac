//! The dashboard page, rendered on the server; `dashboard.js` (embedded) redraws the same
//! sections from `/api/state` every two seconds and draws the rate charts.

use std::fmt::Write;

use courier::ops::HistoryEntry;

use super::state::{DashboardState, Table, time};

const STYLE: &str = include_str!("dashboard.css");
const SCRIPT: &str = include_str!("dashboard.js");

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn table(out: &mut String, headers: &[&str], rows: &[Vec<String>]) {
    out.push_str("<table><thead><tr>");
    for h in headers {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{}</td>", esc(cell));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
}

/// A table laid out on the server ([`Table`]).
fn laid_out(t: &Table) -> String {
    let mut out = String::new();
    table(&mut out, &t.headers, &t.rows);
    out
}

/// The connections' table.
fn connections(s: &DashboardState) -> String {
    let rows: Vec<Vec<String>> = s
        .connections
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                c.writer.clone(),
                c.budget_key.clone(),
                c.circuit.clone(),
                if c.paused { "paused" } else { "-" }.into(),
            ]
        })
        .collect();
    let mut out = String::new();
    table(
        &mut out,
        &["connection", "writer", "budget", "circuit", "paused"],
        &rows,
    );
    out
}

/// Every budget's table, and a chart for each busy one (drawn by the script).
fn budgets(s: &DashboardState) -> String {
    let mut out = laid_out(&s.tables.budgets);
    out.push_str("<div class=\"charts\">");
    for b in s.budgets.iter().filter(|b| b.busy) {
        let _ = write!(
            out,
            "<figure class=\"chart\" data-budget=\"{0}\"><figcaption>{0}: calls per second \
             (last {1} min)</figcaption><svg viewBox=\"0 0 640 160\" role=\"img\"></svg></figure>",
            esc(&b.status.key),
            s.chart_window / 60
        );
    }
    out.push_str("</div>");
    out
}

fn blocks(s: &DashboardState) -> String {
    let rows: Vec<Vec<String>> = s
        .budgets
        .iter()
        .map(|b| &b.status)
        .filter(|b| b.blocked_until.is_some())
        .map(|b| {
            vec![
                b.key.clone(),
                b.connection.clone(),
                time(b.blocked_until),
                b.blocked_by.clone().unwrap_or_else(|| "-".into()),
                b.block_reason.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    if rows.is_empty() {
        return "<p class=\"none\">No rate-limit block in force.</p>".into();
    }
    let mut out = String::new();
    table(
        &mut out,
        &["budget", "connection", "until", "set by rule", "why"],
        &rows,
    );
    out
}

fn circuits(s: &DashboardState) -> String {
    let rows: Vec<Vec<String>> = s
        .connections
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                c.circuit.clone(),
                c.consecutive_failures.to_string(),
                time(c.open_until),
            ]
        })
        .collect();
    let mut out = String::new();
    table(
        &mut out,
        &["connection", "circuit", "failures in a row", "open until"],
        &rows,
    );
    out
}

/// The target's jobs in flight, then those that ended lately.
fn jobs(s: &DashboardState) -> String {
    let mut out = String::from("<h3>In flight</h3>");
    match s.jobs_in_flight.is_empty() {
        true => out.push_str("<p class=\"none\">No job in flight.</p>"),
        false => out.push_str(&laid_out(&s.tables.jobs_in_flight)),
    }
    out.push_str("<h3>Ended lately</h3>");
    match s.jobs_ended.is_empty() {
        true => out.push_str("<p class=\"none\">No job ended.</p>"),
        false => out.push_str(&laid_out(&s.tables.jobs_ended)),
    }
    out
}

/// The open erasures, or a line saying there is none.
fn erasures(s: &DashboardState) -> String {
    match s.erasures.is_empty() {
        true => "<p class=\"none\">No erasure open.</p>".into(),
        false => laid_out(&s.tables.erasures),
    }
}

fn problems(s: &DashboardState) -> String {
    if s.problems.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = s
        .problems
        .iter()
        .map(|p| vec![p.what.clone(), time(Some(p.until)), p.reason.clone()])
        .collect();
    let mut out = String::new();
    table(&mut out, &["what", "left alone until", "reason"], &rows);
    out
}

/// The history table of one record key.
pub fn history(key: &str, lines: &[HistoryEntry]) -> String {
    if lines.is_empty() {
        return format!(
            "<p class=\"none\">No delivery with record key {} (never enqueued, or removed \
             by retention).</p>",
            esc(key)
        );
    }
    let rows: Vec<Vec<String>> = lines
        .iter()
        .map(|l| {
            vec![
                time(Some(l.at)),
                l.rule.clone(),
                l.delivery_id.to_string(),
                l.outcome.map_or("enqueued", |o| o.as_str()).to_owned(),
                l.run_id.map_or_else(|| "-".into(), |r| format!("#{r}")),
                l.attempt.map_or_else(|| "-".into(), |a| a.to_string()),
                l.http_status.map_or_else(|| "-".into(), |s| s.to_string()),
                l.detail.clone().unwrap_or_else(|| "-".into()),
                l.status.as_str().to_owned(),
            ]
        })
        .collect();
    let mut out = String::new();
    table(
        &mut out,
        &[
            "at",
            "rule",
            "delivery",
            "event",
            "run",
            "attempt",
            "http",
            "detail",
            "status now",
        ],
        &rows,
    );
    out
}

/// The whole page.
pub fn render(s: &DashboardState, key: Option<&str>, lines: Option<&[HistoryEntry]>) -> String {
    let history_html = match (key, lines) {
        (Some(k), Some(l)) => history(k, l),
        _ => String::new(),
    };
    let actions = if s.actions {
        "<p class=\"actions\">Actions are enabled. <label>Token <input id=\"token\" \
         type=\"password\" autocomplete=\"off\"></label> <span id=\"action-result\"></span></p>"
    } else {
        "<p class=\"actions none\">Read-only: set <code>COURIER_HTTP_TOKEN</code> on the worker \
         to enable retry, pause and unblock.</p>"
    };
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>courier</title><style>{STYLE}</style></head>
<body data-refreshes="0" data-actions="{actions_flag}">
<header><h1>courier</h1><span id="updated">as of {now}</span></header>
{actions}
<section id="connections"><h2>Connections</h2><div class="body">{connections}</div></section>
<section id="budgets"><h2>Budgets</h2><div class="body">{budgets}</div></section>
<section id="blocks"><h2>Rate-limit blocks</h2><div class="body">{blocks}</div></section>
<section id="circuits"><h2>Circuits</h2><div class="body">{circuits}</div></section>
<section id="rules"><h2>Rules</h2><div class="body">{rules}</div></section>
<section id="problems"><div class="body">{problems}</div></section>
<section id="jobs"><h2>The target's jobs</h2><div class="body">{jobs}</div></section>
<section id="erasures"><h2>Erasures open</h2><div class="body">{erasures}</div></section>
<section id="runs"><h2>Recent runs</h2><div class="body">{runs}</div></section>
<section id="history"><h2>History of a record</h2>
<form id="history-form" method="get" action="/"><input id="history-key" name="key" size="32" placeholder="record key, e.g. customer:123" value="{key}"> <button type="submit">Show</button></form>
<div class="body">{history_html}</div></section>
<script>{SCRIPT}</script>
</body></html>
"#,
        actions_flag = s.actions,
        now = time(Some(s.now)),
        connections = connections(s),
        budgets = budgets(s),
        blocks = blocks(s),
        circuits = circuits(s),
        rules = laid_out(&s.tables.rules),
        problems = problems(s),
        jobs = jobs(s),
        erasures = erasures(s),
        runs = laid_out(&s.tables.runs),
        key = esc(key.unwrap_or("")),
    )
}
