//! The plot of a run: delivered calls per second over time against the declared rate,
//! 429s as red bars, rate-limit blocks shaded, faults (chaos) marked, the budget's pace
//! against the real limit (limits). Plain SVG, no plotting library.

use std::fmt::Write;

use super::Report;

const W: f64 = 960.0;
const H: f64 = 420.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Per whole second: (calls, 429s, blocked at any sample).
fn per_second(report: &Report) -> Vec<(u64, u64, bool)> {
    let Some(last) = report.timeline.last() else {
        return Vec::new();
    };
    let seconds = last.t.ceil().max(1.0) as usize;
    let mut out = vec![(0u64, 0u64, false); seconds];
    let (mut prev_req, mut prev_429) = (0, 0);
    for s in &report.timeline {
        let i = (s.t.floor() as usize).min(seconds - 1);
        out[i].0 += s.requests.saturating_sub(prev_req);
        out[i].1 += s.throttled.saturating_sub(prev_429);
        out[i].2 |= s.blocked;
        prev_req = s.requests;
        prev_429 = s.throttled;
    }
    out
}

/// Draws the report's timeline.
pub fn svg(report: &Report) -> String {
    let buckets = per_second(report);
    let n = buckets.len().max(1) as f64;
    let declared = report.declared_per_second.unwrap_or(0.0);
    let peak = buckets.iter().map(|b| b.0).max().unwrap_or(0) as f64;
    let real_peak = report.real_limit.iter().map(|r| r.1).fold(0.0, f64::max);
    let ymax = (peak.max(declared).max(real_peak) * 1.15).max(1.0);
    let x = |t: f64| LEFT + t / n * (W - LEFT - RIGHT);
    let y = |v: f64| H - BOTTOM - v / ymax * (H - TOP - BOTTOM);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="22" font-size="15">courier bench {}: calls per second</text>"#,
        report.scenario
    );
    // Blocks.
    for (i, b) in buckets.iter().enumerate() {
        if b.2 {
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#f6d5d5"/>"##,
                x(i as f64),
                x(1.0) - x(0.0),
                H - TOP - BOTTOM
            );
        }
    }
    // Faults: a span shaded grey while it lasted, a line and a label where it struck.
    for (i, m) in report.marks.iter().enumerate() {
        if let Some(until) = m.until {
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#e2e2e2"/>"##,
                x(m.t),
                (x(until) - x(m.t)).max(1.0),
                H - TOP - BOTTOM
            );
        }
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{TOP}" y2="{:.1}" stroke="#ff7f0e" stroke-width="1.5"/><text x="{:.1}" y="{:.1}" font-size="10" fill="#ff7f0e">{}</text>"##,
            x(m.t),
            x(m.t),
            H - BOTTOM,
            x(m.t) + 2.0,
            TOP + 10.0 + (i % 3) as f64 * 11.0,
            m.label
        );
    }
    // Axes and grid.
    for k in 0..=5 {
        let v = ymax / 5.0 * k as f64;
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{:.0}</text>"##,
            W - RIGHT,
            y(v),
            y(v),
            LEFT - 6.0,
            y(v) + 4.0,
            v
        );
    }
    let step = ((n / 10.0).ceil() as usize).max(1);
    for t in (0..=buckets.len()).step_by(step) {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{t}</text>"#,
            x(t as f64),
            H - BOTTOM + 16.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since the burst was enqueued</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 12.0
    );
    // 429s per second as red bars from the axis.
    for (i, b) in buckets.iter().enumerate() {
        if b.1 > 0 {
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#d62728"/>"##,
                x(i as f64 + 0.2),
                y(b.1 as f64),
                (x(1.0) - x(0.0)) * 0.6,
                y(0.0) - y(b.1 as f64)
            );
        }
    }
    // Declared rate.
    if declared > 0.0 {
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#555" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">declared {declared:.0}/s</text>"##,
            W - RIGHT,
            y(declared),
            y(declared),
            W - RIGHT,
            y(declared) - 5.0
        );
    }
    // The target's real limit, a step line.
    if !report.real_limit.is_empty() {
        let mut points = Vec::new();
        for (i, &(from, rate)) in report.real_limit.iter().enumerate() {
            let until = report.real_limit.get(i + 1).map_or(n, |r| r.0.min(n));
            points.push(format!("{:.1},{:.1}", x(from.min(n)), y(rate)));
            points.push(format!("{:.1},{:.1}", x(until), y(rate)));
        }
        let _ = writeln!(
            s,
            r##"<polyline points="{}" fill="none" stroke="#2ca02c" stroke-width="2" stroke-dasharray="3 3"/><text x="{:.1}" y="{:.1}" fill="#2ca02c">real limit</text>"##,
            points.join(" "),
            LEFT + 4.0,
            y(report.real_limit[0].1) - 5.0
        );
    }
    // Calls per second.
    let points: Vec<String> = buckets
        .iter()
        .enumerate()
        .map(|(i, b)| format!("{:.1},{:.1}", x(i as f64 + 0.5), y(b.0 as f64)))
        .collect();
    let _ = writeln!(
        s,
        r##"<polyline points="{}" fill="none" stroke="#1f77b4" stroke-width="2"/>"##,
        points.join(" ")
    );
    // The budget's pace (limits only): the rate it let calls go at, sample by sample.
    let paced: Vec<String> = report
        .timeline
        .iter()
        .filter_map(|s| Some(format!("{:.1},{:.1}", x(s.t), y(s.pace?))))
        .collect();
    if !paced.is_empty() {
        let _ = writeln!(
            s,
            r##"<polyline points="{}" fill="none" stroke="#9467bd" stroke-width="1.5"/>"##,
            paced.join(" ")
        );
    }
    // Legend.
    let _ = writeln!(
        s,
        r##"<g transform="translate({:.1},{:.1})"><line x1="0" x2="20" y1="0" y2="0" stroke="#1f77b4" stroke-width="2"/><text x="26" y="4">calls/s</text><rect x="90" y="-6" width="12" height="12" fill="#d62728"/><text x="108" y="4">429s/s</text><rect x="170" y="-6" width="12" height="12" fill="#f6d5d5"/><text x="188" y="4">blocked</text>{}</g>"##,
        W - RIGHT - if paced.is_empty() { 260.0 } else { 380.0 },
        22.0,
        if paced.is_empty() {
            ""
        } else {
            r##"<line x1="250" x2="270" y1="0" y2="0" stroke="#9467bd" stroke-width="1.5"/><text x="276" y="4">budget's pace</text>"##
        }
    );
    s.push_str("</svg>\n");
    s
}
